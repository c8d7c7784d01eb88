// comm.encrypt: an authenticated, encrypted data plane over any communicator (Gloo's plain TCP in practice).
//
// with_encryption wraps a group whose members span more than one cluster ("wan", the default when the job has a
// secret) or every group of more than one rank ("all"). Joining costs one collective: every member makes a fresh
// X25519 key pair, the public keys are all-gathered in the clear, each pair derives its two directional keys bound
// to the job secret (secure/channel_crypto.h), and each pair proves it holds them with one sealed message each way
// before the group is handed out, so a peer with another secret (or a key swapped in the path) is refused at once,
// naming it.
//
// Every byte the wrapper moves is sealed (AES-256-GCM or ChaCha20-Poly1305) with a sequence number per pair,
// direction and tag: point-to-point messages are sealed by the sender's thread as they are posted and opened by
// the receiver's wait(); the collectives run crosstrain's own algorithms (ring, tree; comm/algorithms) over those
// sealed messages on one worker thread per group, so they stay asynchronous. A message that was changed, replayed,
// reordered, dropped or cut short does not open: the operation fails with a CommError naming the peer, the
// operation and the step, the message is discarded (never reduced into anything) and the group is broken from then
// on, as after any communication failure (elastic training counts it as that group's failure and re-forms).
// A failed operation leaves its output buffers unspecified, as any failed collective does.
//
// Sub-groups made by split() are wrapped by the same rule: under "wan", a sub-group inside one cluster (tensor and
// pipeline groups, DiLoCo's local groups) is the plain one, so only the traffic that crosses clusters pays.
// Clusters are the `cluster` each rank passes; when a rank does not know its cluster (-1), each host counts as a
// cluster of its own.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/config.h"

namespace crosstrain::comm {

// The sealed communicator's own message tags start here (its ring all-reduce uses the first two), above those of
// the algorithm communicator (comm/algorithms/communicator.h) that may run on top of it on another thread.
constexpr int kSealedTagBase = (1 << 20) + 8192;

enum class EncryptMode { Off, Wan, All };
const char* to_string(EncryptMode m);

// comm.encrypt: "auto" (wan when the job has a secret or an identity, else off), "wan", "all" or "off". Throws
// UsageError for another value, and for wan or all without either (it names where a secret comes from).
EncryptMode resolve_encrypt_mode(const std::string& setting, bool has_secret);

struct DataPlaneSecurity {
  EncryptMode mode = EncryptMode::Off;
  std::string secret;  // the job secret (CROSSTRAIN_SECRET or run.secret_file); never sent
  int cluster = -1;    // this process's cluster (sync.topology, CROSSTRAIN_CLUSTER); -1: unknown
  // A cluster identity (comm.identity, comm.peer_keys): this rank signs its group key with its cluster's Ed25519
  // key, and every member's signature is checked against the public key held for the cluster it names. With it,
  // groups are authenticated without a job secret (and with one, by both).
  std::string identity_cluster;
  std::vector<unsigned char> identity_key;  // 64 bytes, libsodium's layout; empty: no identity
  std::map<std::string, std::array<unsigned char, 32>> peer_keys;
  bool has_identity() const { return !identity_key.empty(); }
};

// The security of this process's groups from [comm] and the job secret: comm.encrypt resolved (auto is wan when
// there is a secret or an identity), and comm.identity (a cluster's key file, mode 0600) and comm.peer_keys (a
// keys.json of cluster -> public key) read. Throws UsageError naming the file or key that is wrong.
DataPlaneSecurity data_plane_security(const CommConfig& config, const std::string& secret, int cluster);

// Collective over `inner` (the members exchange clusters and host names, then keys). Returns `inner` unchanged
// when the mode is off, the group has one rank, or (wan) all its members are in one cluster.
std::unique_ptr<Communicator> with_encryption(std::unique_ptr<Communicator> inner, const DataPlaneSecurity& security);

// True when `c` (or a communicator it wraps) seals its messages: its back end name carries "+sealed".
bool is_encrypted(const Communicator& c);

}  // namespace crosstrain::comm
