// Who may join a job's rendezvous store: the job id (namespaces the store, refuses other jobs) and the job secret
// (challenge-response, both ways). Pure logic over libsodium, no sockets, so every step is tested on its own.
//
// The handshake when the store has a secret (protocol version 2; store_protocol.h has the frames):
//   client -> server  preamble, Hello{rank, world_size, job, nonce: Nc (32 random bytes)}
//   server -> client  Challenge{Ns (32 fresh random bytes)}
//   client -> server  Proof{HMAC(secret, "client" | job | rank | world_size | Nc | Ns)}   (empty: no secret)
//   server -> client  Refused{reason}, or Ok{..., "proof", HMAC(secret, "server" | job | Nc | Ns)}
// HMAC-SHA-256 (libsodium's crypto_auth_hmacsha256, the secret as its key) over length-prefixed fields, compared
// in constant time. The secret never travels; a proof answers one pair of fresh nonces only (no replay), the two
// directions carry different labels (one side's proof cannot be reflected as the other's), and the client's
// proof binds the rank and job it claims. The store proves itself only to a client that proved the secret first,
// so a stranger who reaches the port gets no HMAC to guess the secret against offline; the client refuses a
// store whose proof is missing or wrong. An HMAC is not a PAKE: an impostor posing as the store (it must answer
// at MASTER_ADDR) gets one client proof, against which a weak secret can be guessed offline, so a secret should
// be random (`openssl rand -hex 32`). After the handshake the session is sealed (SessionSealer below); Gloo's
// data plane is sealed by comm.encrypt (comm/secure/encryption.h). docs/security.md has the whole threat model.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace crosstrain::comm {

// What a process knows about its job. Both empty: an unnamed job without a secret (anyone may join).
struct JobCredentials {
  std::string job_id;  // CROSSTRAIN_JOB_ID (or torchrun's TORCHELASTIC_RUN_ID); the launcher makes one up
  std::string secret;  // CROSSTRAIN_SECRET or run.secret_file; never sent, never logged
};

namespace store {

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // crypto_auth_hmacsha256_BYTES

std::string random_nonce();  // kNonceBytes from libsodium's CSPRNG (getrandom)
std::string new_job_id();    // 16 random hex digits, for a launcher that was given none

std::string server_proof(const std::string& secret, const std::string& job, const std::string& client_nonce,
                         const std::string& server_nonce);
std::string client_proof(const std::string& secret, const std::string& job, int rank, int world_size,
                         const std::string& client_nonce, const std::string& server_nonce);
// Constant-time comparison; false when the sizes differ.
bool proof_matches(const std::string& expected, const std::string& got);

// Why a store of job `store_job` refuses a client of job `client_job` ("" when they match).
std::string job_mismatch(const std::string& client_job, const std::string& store_job);

// The server's verdict on a client's proof: what it tells the client, and what it logs about the peer.
struct ProofVerdict {
  bool admitted = false;
  std::string reason;   // to the client (Refused)
  std::string log_why;  // the end of the server's log line: "it did not prove the job secret"
};
ProofVerdict check_client_proof(const std::string& secret, const std::string& job, int rank, int world_size,
                                const std::string& client_nonce, const std::string& server_nonce,
                                const std::string& proof);
// The client's verdict on a server's challenge: "" when the server proved the secret, else why not.
std::string check_server_proof(const std::string& secret, const std::string& job, const std::string& client_nonce,
                               const std::string& server_nonce, const std::string& proof);

// One line per refused peer, at most `burst` lines per `window`; the first line after a quiet spell says how many
// were left out, so a flood of strangers cannot fill the launcher's log. Not thread-safe: the caller locks.
class RefusalLog {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RefusalLog(int burst = 5, std::chrono::milliseconds window = std::chrono::seconds(60))
      : burst_(burst), window_(window) {}
  // The line to print for this refusal, or nothing when it is one too many.
  std::optional<std::string> line(const std::string& peer, const std::string& why, Clock::time_point now);

 private:
  int burst_;
  std::chrono::milliseconds window_;
  Clock::time_point window_start_{};
  int in_window_ = 0;
  int64_t left_out_ = 0;
};

// A store session after a handshake with a secret (protocol version 3): every frame after the server's Ok is
// sealed, both ways, with ChaCha20-Poly1305 (libsodium). The two directions' keys are HMACs of a session key,
// itself the HMAC of the secret over the handshake (job, rank, world size, both nonces): fresh for every
// connection, and known only to the two ends that proved the secret. The nonce is the frame's number in its
// direction and the associated data its length prefix, so a frame that is changed, replayed, reordered, dropped
// or cut short does not open: the connection is closed (the client reports it, the server logs it).
class SessionSealer {
 public:
  enum class Side { Client, Server };
  static constexpr size_t kOverhead = 16;  // bytes a sealed frame adds (the tag)

  SessionSealer(Side side, const std::string& secret, const std::string& job, int rank, int world_size,
                const std::string& client_nonce, const std::string& server_nonce);
  ~SessionSealer();
  SessionSealer(const SessionSealer&) = delete;
  SessionSealer& operator=(const SessionSealer&) = delete;

  // The bytes to send for an encoded frame (length prefix and body): the new length prefix, the sealed body and
  // its tag.
  std::vector<uint8_t> seal(const std::vector<uint8_t>& frame);
  // Opens in place a received sealed body that `prefix` (its 4-byte length) announced; on success `body` holds
  // the plain body. False when it does not authenticate (then nothing of it may be used).
  bool open(const uint8_t* prefix, std::vector<uint8_t>& body);

 private:
  std::string send_key_, recv_key_;
  uint64_t sent_ = 0, received_ = 0;
};

// The secret held in `path` (surrounding whitespace trimmed). Throws UsageError naming the file when it cannot be
// read, is empty, or can be read or written by anyone but its owner (as ssh refuses a private key).
std::string read_secret_file(const std::string& path);

// The warning for a store that listens beyond loopback without a secret; `who` is "crosstrain run" or "crosstrain".
std::string open_store_warning(const std::string& who, const std::string& address);

}  // namespace store
}  // namespace crosstrain::comm
