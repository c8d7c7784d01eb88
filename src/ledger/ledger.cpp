// The ledger's hash chain: canonical entries, hashes, signatures, verification and appends (ledger/ledger.h).
#include "crosstrain/ledger/ledger.h"

#include <fcntl.h>
#include <sodium.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "crosstrain/core/error.h"
#include "internal.h"

namespace crosstrain::scheduler {
namespace fs = std::filesystem;
using nlohmann::json;
using namespace ledger_detail;

namespace {

constexpr char kDomain[] = "crosstrain-ledger/1";  // hashed with its terminating zero byte
const std::string kGenesis(64, '0');
const std::set<std::string> kFields = {"seq",   "cluster", "job",   "interval_start", "interval_end",
                                       "first_step", "steps", "tokens", "flops", "bytes",
                                       "gradient_digests", "prev_hash", "hash", "signature"};

// A problem with one line; verify turns it into the report's reason.
struct BadLine : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string quoted(const std::string& s) { return json(s).dump(); }

// %.17g round-trips a double, so parsing and printing again gives the same bytes.
std::string number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

bool is_hex(const std::string& s, size_t chars) {
  if (s.size() != chars) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// The checks every entry's fields must pass, whether read from a file or about to be appended.
void check_fields(const LedgerEntry& e) {
  if (!valid_cluster_name(e.cluster)) throw BadLine("cluster name " + quoted(e.cluster) + " is not valid");
  if (e.job.empty()) throw BadLine("job is empty");
  if (e.interval_end < e.interval_start) throw BadLine("interval ends before it starts");
  if (e.first_step < 0 || e.steps < 0 || e.tokens < 0 || e.bytes < 0)
    throw BadLine("first_step, steps, tokens and bytes must not be negative");
  if (!std::isfinite(e.flops) || e.flops < 0) throw BadLine("flops must be a finite number >= 0");
  for (const auto& [step, digest] : e.gradient_digests) {
    if (step < 0) throw BadLine("gradient digest for negative step " + std::to_string(step));
    if (!is_hex(digest, 64))
      throw BadLine("gradient digest of step " + std::to_string(step) + " is not 64 lower-case hex digits");
  }
}

int64_t int_field(const json& doc, const char* name) {
  const auto it = doc.find(name);
  if (it == doc.end()) throw BadLine(std::string("field '") + name + "' is missing");
  if (!it->is_number_integer()) throw BadLine(std::string("field '") + name + "' is not an integer");
  return it->get<int64_t>();
}

std::string string_field(const json& doc, const char* name) {
  const auto it = doc.find(name);
  if (it == doc.end()) throw BadLine(std::string("field '") + name + "' is missing");
  if (!it->is_string()) throw BadLine(std::string("field '") + name + "' is not a string");
  return it->get<std::string>();
}

std::map<int64_t, std::string> digests_field(const json& doc) {
  const auto it = doc.find("gradient_digests");
  if (it == doc.end()) throw BadLine("field 'gradient_digests' is missing");
  if (!it->is_object()) throw BadLine("field 'gradient_digests' is not an object");
  std::map<int64_t, std::string> out;
  for (const auto& [key, value] : it->items()) {
    size_t used = 0;
    int64_t step = -1;
    try {
      step = std::stoll(key, &used);
    } catch (const std::exception&) {
    }
    if (used != key.size() || key.empty() || std::to_string(step) != key || !value.is_string())
      throw BadLine("gradient_digests key " + quoted(key) + " is not a step number with a string digest");
    out[step] = value.get<std::string>();
  }
  return out;
}

LedgerEntry parse_entry(const std::string& line) {
  json doc;
  try {
    doc = json::parse(line);
  } catch (const json::exception&) {
    throw BadLine("not a complete JSON entry");
  }
  if (!doc.is_object()) throw BadLine("not a JSON object");
  for (const auto& [key, value] : doc.items())
    if (!kFields.count(key)) throw BadLine("unknown field " + quoted(key) + " (not covered by the signature)");
  LedgerEntry e;
  e.seq = int_field(doc, "seq");
  e.cluster = string_field(doc, "cluster");
  e.job = string_field(doc, "job");
  e.interval_start = int_field(doc, "interval_start");
  e.interval_end = int_field(doc, "interval_end");
  e.first_step = int_field(doc, "first_step");
  e.steps = int_field(doc, "steps");
  e.tokens = int_field(doc, "tokens");
  if (!doc.contains("flops") || !doc["flops"].is_number()) throw BadLine("field 'flops' is missing or not a number");
  e.flops = doc["flops"].get<double>();
  e.bytes = int_field(doc, "bytes");
  e.gradient_digests = digests_field(doc);
  e.prev_hash = string_field(doc, "prev_hash");
  e.hash = string_field(doc, "hash");
  e.signature = string_field(doc, "signature");
  check_fields(e);
  return e;
}

bool signature_valid(const LedgerEntry& e, const std::array<unsigned char, 32>& public_key) {
  unsigned char hash[crypto_hash_sha256_BYTES], sig[crypto_sign_BYTES];
  if (!from_hex(e.hash, hash, sizeof hash) || !from_hex(e.signature, sig, sizeof sig)) return false;
  return crypto_sign_verify_detached(sig, hash, sizeof hash, public_key.data()) == 0;
}

// Checks entry `e` (line `line`) against the chain so far; throws BadLine naming what is wrong.
void check_link(const LedgerEntry& e, const LedgerVerifyReport& so_far, const PublicKeys& keys,
                const LedgerVerifyOptions& options) {
  const int64_t expected_seq = so_far.entries + 1;
  if (e.seq > expected_seq)
    throw BadLine("seq " + std::to_string(e.seq) + " where " + std::to_string(expected_seq) +
                  " was expected: entries before it were removed");
  if (e.seq < expected_seq)
    throw BadLine("seq " + std::to_string(e.seq) + " where " + std::to_string(expected_seq) +
                  " was expected: entries were reordered or repeated");
  const std::string& prev = so_far.entries == 0 ? kGenesis : so_far.head_hash;
  if (e.prev_hash != prev) throw BadLine("prev_hash is not the previous entry's hash: the chain is broken here");
  if (e.hash != entry_hash(e)) throw BadLine("hash does not match the entry's contents: the entry was altered");
  const auto key = keys.find(e.cluster);
  if (key == keys.end()) {
    if (options.require_known_clusters)
      throw BadLine("cluster " + quoted(e.cluster) + " has no public key in the keys file: unknown contributor");
    return;
  }
  if (!signature_valid(e, key->second))
    throw BadLine("signature is not cluster " + quoted(e.cluster) + "'s: forged or damaged");
}

void add_totals(const LedgerEntry& e, LedgerVerifyReport& report) {
  ClusterTotals& t = report.totals[e.cluster];
  ++t.entries;
  t.steps += e.steps;
  t.tokens += e.tokens;
  t.flops += e.flops;
  t.bytes += e.bytes;
}

}  // namespace

std::string canonical_json(const LedgerEntry& e) {
  std::string out = "{\"seq\":" + std::to_string(e.seq) + ",\"cluster\":" + quoted(e.cluster) +
                    ",\"job\":" + quoted(e.job) + ",\"interval_start\":" + std::to_string(e.interval_start) +
                    ",\"interval_end\":" + std::to_string(e.interval_end) +
                    ",\"first_step\":" + std::to_string(e.first_step) + ",\"steps\":" + std::to_string(e.steps) +
                    ",\"tokens\":" + std::to_string(e.tokens) + ",\"flops\":" + number(e.flops) +
                    ",\"bytes\":" + std::to_string(e.bytes) + ",\"gradient_digests\":{";
  bool first = true;
  for (const auto& [step, digest] : e.gradient_digests) {
    out += (first ? "\"" : ",\"") + std::to_string(step) + "\":" + quoted(digest);
    first = false;
  }
  return out + "}}";
}

std::string ledger_digest(const void* data, size_t size) {
  ensure_sodium();
  unsigned char out[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(out, static_cast<const unsigned char*>(data), size);
  return to_hex(out, sizeof out);
}

std::string entry_hash(const LedgerEntry& e) {
  ensure_sodium();
  unsigned char prev[crypto_hash_sha256_BYTES];
  if (!from_hex(e.prev_hash, prev, sizeof prev)) return "";
  const std::string canonical = canonical_json(e);
  crypto_hash_sha256_state state;
  crypto_hash_sha256_init(&state);
  crypto_hash_sha256_update(&state, reinterpret_cast<const unsigned char*>(kDomain), sizeof kDomain);
  crypto_hash_sha256_update(&state, prev, sizeof prev);
  crypto_hash_sha256_update(&state, reinterpret_cast<const unsigned char*>(canonical.data()), canonical.size());
  unsigned char out[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&state, out);
  return to_hex(out, sizeof out);
}

std::string entry_line(const LedgerEntry& e) {
  std::string line = canonical_json(e);
  line.pop_back();  // the closing brace: the chain fields follow the signed ones
  return line + ",\"prev_hash\":" + quoted(e.prev_hash) + ",\"hash\":" + quoted(e.hash) +
         ",\"signature\":" + quoted(e.signature) + "}";
}

std::string LedgerVerifyReport::message() const {
  if (ok) return "ok: " + std::to_string(entries) + " entries";
  return "line " + std::to_string(bad_line) + ": " + reason;
}

LedgerVerifyReport verify_ledger_text(const std::string& text, const PublicKeys& keys,
                                      const LedgerVerifyOptions& options) {
  ensure_sodium();
  LedgerVerifyReport report;
  bool head_seen = options.expected_head.empty();
  size_t pos = 0;
  for (int64_t line_no = 1; pos < text.size(); ++line_no) {
    const size_t end = text.find('\n', pos);
    const std::string line = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    try {
      if (end == std::string::npos)
        throw BadLine("incomplete last line (no newline at its end): an interrupted append; cut the file to " +
                      std::to_string(pos) + " bytes to keep the entries before it");
      LedgerEntry e = parse_entry(line);
      check_link(e, report, keys, options);
      add_totals(e, report);
      ++report.entries;
      report.head_hash = e.hash;
      head_seen = head_seen || e.hash == options.expected_head;
      report.parsed.push_back(std::move(e));
    } catch (const BadLine& bad) {
      report.ok = false;
      report.bad_line = line_no;
      report.reason = bad.what();
      return report;
    }
    pos = end + 1;
  }
  if (!head_seen) {
    report.ok = false;
    report.bad_line = report.entries + 1;
    report.reason = "the chain does not contain the expected head " + options.expected_head +
                    ": entries at its end were removed";
  }
  return report;
}

LedgerVerifyReport verify_ledger(const std::string& path, const PublicKeys& keys, const LedgerVerifyOptions& options) {
  if (!fs::exists(path)) throw UsageError("ledger '" + path + "' does not exist");
  return verify_ledger_text(read_whole_file(path), keys, options);
}

namespace {

// Reads the whole of an open file from offset 0.
std::string read_fd(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw UsageError("cannot stat '" + path + "': " + std::strerror(errno));
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pread(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw UsageError("cannot read '" + path + "': " + std::strerror(errno));
    done += static_cast<size_t>(n);
  }
  return text;
}

// RAII for the ledger's descriptor: closing it also drops the flock.
struct Fd {
  int fd;
  ~Fd() { ::close(fd); }
};

}  // namespace

void seal_entry(LedgerEntry& e, int64_t seq, const std::string& prev_hash, const LedgerKey& key) {
  ensure_sodium();
  e.seq = seq;
  e.prev_hash = prev_hash.empty() ? kGenesis : prev_hash;
  e.hash = entry_hash(e);
  unsigned char hash[crypto_hash_sha256_BYTES], sig[crypto_sign_BYTES];
  if (!from_hex(e.hash, hash, sizeof hash)) throw UsageError("prev_hash '" + prev_hash + "' is not 64 hex digits");
  crypto_sign_detached(sig, nullptr, hash, sizeof hash, key.secret_key.data());
  e.signature = to_hex(sig, sizeof sig);
}

namespace {

// Opens and locks the ledger, verifies its chain against `keys` (clusters absent from them unchecked), lets `make`
// build the next entry from the verified chain, and appends it in one write, fsynced. Returns what was appended.
LedgerEntry append_locked(const std::string& path, const PublicKeys& keys,
                          const std::function<LedgerEntry(const LedgerVerifyReport&)>& make) {
  ensure_sodium();
  Fd file{::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644)};
  if (file.fd < 0) throw UsageError("cannot open ledger '" + path + "': " + std::strerror(errno));
  if (::flock(file.fd, LOCK_EX) != 0) throw UsageError("cannot lock ledger '" + path + "': " + std::strerror(errno));
  const std::string text = read_fd(file.fd, path);
  LedgerVerifyOptions options;
  options.require_known_clusters = false;
  const LedgerVerifyReport chain = verify_ledger_text(text, keys, options);
  if (!chain.ok)
    throw UsageError("refusing to append to ledger '" + path + "', whose chain does not verify: " + chain.message());
  const LedgerEntry entry = make(chain);
  // One write of the whole line: a crash can leave at most an incomplete last line, which verify names.
  if (!write_all(file.fd, entry_line(entry) + "\n")) {
    const int err = errno;
    if (::ftruncate(file.fd, static_cast<off_t>(text.size())) != 0) { /* verify will name the partial line */ }
    throw UsageError("cannot append to ledger '" + path + "': " + std::strerror(err));
  }
  if (::fsync(file.fd) != 0) throw UsageError("cannot sync ledger '" + path + "': " + std::strerror(errno));
  if (text.empty()) {
    // A new file: its directory entry must be durable too.
    const std::string dir = fs::absolute(path).parent_path().string();
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      ::fsync(dfd);
      ::close(dfd);
    }
  }
  return entry;
}

}  // namespace

std::string read_ledger_locked(const std::string& path) {
  Fd file{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (file.fd < 0) {
    if (errno == ENOENT) return "";
    throw UsageError("cannot open ledger '" + path + "': " + std::strerror(errno));
  }
  if (::flock(file.fd, LOCK_SH) != 0) throw UsageError("cannot lock ledger '" + path + "': " + std::strerror(errno));
  return read_fd(file.fd, path);
}

LedgerEntry append_sealed_entry(const std::string& path, const std::string& line, const PublicKeys& keys) {
  LedgerEntry entry;
  try {
    entry = parse_entry(line);
  } catch (const BadLine& bad) {
    throw UsageError(std::string("not a ledger entry: ") + bad.what());
  }
  if (!keys.count(entry.cluster))
    throw UsageError("cluster '" + entry.cluster + "' has no public key here: its entries are not taken");
  return append_locked(path, keys, [&](const LedgerVerifyReport& chain) {
    const std::string head = chain.entries == 0 ? kGenesis : chain.head_hash;
    if (entry.seq != chain.entries + 1 || entry.prev_hash != head)
      throw LedgerConflict("the ledger holds " + std::to_string(chain.entries) + " entries (head " + head.substr(0, 12) +
                           "), not what entry " + std::to_string(entry.seq) + " was sealed after: read it again");
    LedgerVerifyOptions strict;
    try {
      check_link(entry, chain, keys, strict);  // its hash, and its cluster's signature over it
    } catch (const BadLine& bad) {
      throw UsageError(std::string("entry refused: ") + bad.what());
    }
    // A cluster claims each step of a job once (ledger claim reads what it claimed before sealing).
    for (const LedgerEntry& e : chain.parsed)
      if (e.cluster == entry.cluster && e.job == entry.job && e.first_step < entry.first_step + entry.steps &&
          entry.first_step < e.first_step + e.steps)
        throw UsageError("entry refused: cluster '" + entry.cluster + "' already claimed steps " +
                         std::to_string(e.first_step) + "-" + std::to_string(e.first_step + e.steps - 1) + " of job '" +
                         entry.job + "' (entry " + std::to_string(e.seq) + ")");
    return entry;
  });
}

LedgerEntry append_ledger(const std::string& path, LedgerEntry entry, const LedgerKey& key, const PublicKeys& keys) {
  if (entry.cluster != key.cluster)
    throw UsageError("the entry is for cluster '" + entry.cluster + "' but the key is cluster '" + key.cluster +
                     "'s: each cluster signs its own entries with its own key");
  try {
    check_fields(entry);
  } catch (const BadLine& bad) {
    throw UsageError(std::string("cannot append: ") + bad.what());
  }
  PublicKeys known = keys;
  const auto listed = known.find(key.cluster);
  if (listed != known.end() && listed->second != key.public_key)
    throw UsageError("the keys file's public key of cluster '" + key.cluster + "' is not this key's");
  known[key.cluster] = key.public_key;
  return append_locked(path, known, [&](const LedgerVerifyReport& chain) {
    seal_entry(entry, chain.entries + 1, chain.head_hash, key);
    return entry;
  });
}

}  // namespace crosstrain::scheduler
