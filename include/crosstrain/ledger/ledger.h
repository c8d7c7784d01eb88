// The ledger of contributed compute (issue 19, docs/ledger.md): each cluster signs what it contributed per
// interval (steps, tokens, FLOPs, bytes, and a digest of each step's gradient) with its own Ed25519 key; entries
// form an append-only hash chain in a JSONL file that anyone holding the clusters' public keys can verify; spot
// checks recompute sampled steps elsewhere and flag contributors whose claims or gradients do not match.
//
// Chain: hash_i = SHA-256("crosstrain-ledger/1" 0x00 || prev_hash_i (32 bytes) || canonical_i), prev_hash_1 = 32
// zero bytes, prev_hash_i = hash_{i-1}; signature_i = Ed25519(hash_i) by cluster_i's key. canonical_i is the entry's
// fields as compact JSON in a fixed order (canonical_json below), so the signed bytes are well-defined.
// Pure: libsodium and nlohmann-json, no libtorch.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace crosstrain::scheduler {

// A cluster's signing key. The secret key file (ledger keygen) is mode 0600.
struct LedgerKey {
  std::string cluster;
  std::array<unsigned char, 32> public_key{};
  std::array<unsigned char, 64> secret_key{};  // libsodium's layout: seed || public key
};

LedgerKey generate_ledger_key(const std::string& cluster);
// Writes DIR/CLUSTER.key (JSON with the cluster and the hex secret key, mode 0600, never overwritten) and
// DIR/CLUSTER.pub (the hex public key), and adds the cluster to DIR/keys.json (written to a temporary name and
// renamed). Returns the path of the secret key file. A key file that exists already is a UsageError.
std::string write_ledger_key(const LedgerKey& key, const std::string& dir);
// Reads a secret key file; refuses one that others may read (mode wider than 0600) or whose public half does not
// match its secret half.
LedgerKey read_ledger_key(const std::string& path);

// Cluster name -> 32-byte public key. The keys file is a JSON object {"NAME": "HEX public key", ...}.
using PublicKeys = std::map<std::string, std::array<unsigned char, 32>>;
PublicKeys read_public_keys(const std::string& path);
void write_public_keys(const PublicKeys& keys, const std::string& path);

// One signed claim: cluster `cluster` computed steps [first_step, first_step + steps) of job `job` between
// interval_start and interval_end (Unix seconds), with `tokens` tokens, `flops` floating-point operations and
// `bytes` bytes sent over the network. gradient_digests holds step -> hex SHA-256 of that step's gradient bytes
// (ledger_digest); spot checks sample steps of the claimed range, so an honest contributor commits every step.
struct LedgerEntry {
  int64_t seq = 0;  // 1, 2, 3, ... in file order
  std::string cluster, job;
  int64_t interval_start = 0, interval_end = 0;
  int64_t first_step = 0, steps = 0, tokens = 0;
  double flops = 0;
  int64_t bytes = 0;
  std::map<int64_t, std::string> gradient_digests;
  std::string prev_hash, hash, signature;  // hex
};

// The signed fields (all but prev_hash, hash, signature) as compact JSON in a fixed order.
std::string canonical_json(const LedgerEntry& entry);
// hex SHA-256 of the domain tag, the previous hash and the canonical JSON.
std::string entry_hash(const LedgerEntry& entry);
// The entry as one ledger line (canonical fields, then prev_hash, hash, signature), without the newline.
std::string entry_line(const LedgerEntry& entry);
// Makes `entry` the chain's entry number `seq` after the entry whose hash is `prev_hash` ("" for the first):
// fills in seq, prev_hash, hash and signature (Ed25519 over the hash with `key`). For ledgers built in memory;
// append_ledger does this against the file's chain.
void seal_entry(LedgerEntry& entry, int64_t seq, const std::string& prev_hash, const LedgerKey& key);
// hex SHA-256 of raw bytes: the digest of a step's gradient that contributors report and checkers recompute.
std::string ledger_digest(const void* data, size_t size);

// Where a ledger first goes wrong, and per-cluster totals of what it holds.
struct ClusterTotals {
  int64_t entries = 0, steps = 0, tokens = 0, bytes = 0;
  double flops = 0;
};
struct LedgerVerifyReport {
  bool ok = true;
  int64_t bad_line = 0;  // 1-based line of the first bad entry
  std::string reason;    // what is wrong with it
  int64_t entries = 0;   // entries checked and good (all of them when ok)
  std::string head_hash; // hash of the last good entry ("" for an empty ledger)
  std::map<std::string, ClusterTotals> totals;
  std::vector<LedgerEntry> parsed;  // the good entries, in order
  std::string message() const;     // "line 3: ..." or "ok: N entries"
};

struct LedgerVerifyOptions {
  // Check signatures of clusters absent from the keys as well (false: skip them; append uses this to check the
  // chain's integrity with only its own key).
  bool require_known_clusters = true;
  std::string expected_head;  // non-empty: the chain must contain an entry with this hash (guards truncation)
};

// Checks every line: complete JSON with exactly the entry's fields, seq = previous + 1, prev_hash = previous hash,
// hash = entry_hash, a known cluster, a valid signature over the hash, interval_end >= interval_start, counts >= 0.
// Stops at the first bad line. A missing file is a UsageError; an empty one verifies with 0 entries.
LedgerVerifyReport verify_ledger(const std::string& path, const PublicKeys& keys, const LedgerVerifyOptions& options = {});
LedgerVerifyReport verify_ledger_text(const std::string& text, const PublicKeys& keys,
                                      const LedgerVerifyOptions& options = {});

// Appends `entry` (its seq, prev_hash, hash and signature are filled in here) signed with `key`, which must be
// the entry's cluster's. Under an exclusive flock: verifies the existing chain (signatures of clusters in `keys`
// and of `key`'s own cluster), refuses to append to a chain that does not verify, then writes the line in one
// write and fsyncs. Returns the entry as appended.
LedgerEntry append_ledger(const std::string& path, LedgerEntry entry, const LedgerKey& key, const PublicKeys& keys = {});

// The chain moved on between a cluster reading its head and sending an entry sealed after it: read it again.
struct LedgerConflict : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Appends one ledger line sealed and signed elsewhere (a cluster that reaches the ledger's keeper only over the
// network: the scheduler's POST /api/ledger). Under the same lock as append_ledger: the chain must verify, the line
// must be its next entry (seq, prev_hash: else LedgerConflict), of a cluster in `keys`, with that cluster's valid
// signature over its hash, claiming no step its cluster claimed for the job before (else UsageError naming what is
// wrong). Returns the entry as appended.
LedgerEntry append_sealed_entry(const std::string& path, const std::string& line, const PublicKeys& keys);
// The ledger's text under a shared lock (never half of an entry being appended); "" for a ledger not yet written.
std::string read_ledger_locked(const std::string& path);

// ---- spot checks -------------------------------------------------------------------------------------------------
// What a job's steps must amount to: tokens = steps * tokens_per_step; flops = tokens * flops_per_token (6 * the
// parameter count for a dense model's forward + backward) within `tolerance`.
// shared_steps: several clusters compute parts of every step (one job trained data-parallel across clusters, each
// claiming its own share from its work log: `crosstrain ledger claim`). Then an entry's tokens may be less than
// steps * tokens_per_step, its flops must be its own tokens * flops_per_token, the same step may be claimed by
// several clusters as long as their tokens for it add up to at most tokens_per_step (an entry's tokens count as
// spread evenly over its steps), and a cluster that claims a step twice is flagged.
struct JobWork {
  int64_t tokens_per_step = 0;  // 0: not checked
  double flops_per_token = 0;   // 0: not checked
  bool shared_steps = false;
};

struct SpotCheckOptions {
  uint64_t seed = 0;             // with the entry hashes, fixes the sample: anyone can redraw it
  int samples_per_entry = 2;     // distinct steps of each entry's range (all of them if the range is smaller)
  double tolerance = 0.05;       // relative, for tokens and flops
  std::map<std::string, JobWork> jobs;
};

// The checker's own computation of a step: hex digest of the gradient, or "" when it cannot recompute that job.
using Recompute = std::function<std::string(const std::string& job, int64_t step)>;

struct SpotCheckFlag {
  std::string cluster;
  int64_t seq = 0;
  std::string reason;
};
struct SpotCheckReport {
  std::vector<SpotCheckFlag> flags;
  int64_t steps_recomputed = 0, steps_matched = 0, steps_skipped = 0;
  std::vector<std::string> flagged_clusters() const;  // sorted, each once
};

// The steps spot_check samples from an entry: deterministic in (seed, entry hash), distinct, inside the range.
std::vector<int64_t> sample_steps(const LedgerEntry& entry, uint64_t seed, int count);
// Flags, per entry: claimed work inconsistent with its job (tokens, flops), a step claimed twice for a job, a
// sampled step without a committed digest, and a committed digest that differs from the recomputed one.
SpotCheckReport spot_check(const std::vector<LedgerEntry>& entries, const SpotCheckOptions& options,
                           const Recompute& recompute);
// The same, for jobs whose clusters share steps: each cluster's share of a step has its own gradient, so the
// checker recomputes cluster `cluster`'s share ("" when it cannot).
using RecomputeShare = std::function<std::string(const std::string& cluster, const std::string& job, int64_t step)>;
SpotCheckReport spot_check_shares(const std::vector<LedgerEntry>& entries, const SpotCheckOptions& options,
                                  const RecomputeShare& recompute);

}  // namespace crosstrain::scheduler
