// The per-cluster work log (ledger/work_log.h): what each cluster did per step, for ledger claims.
#include "crosstrain/ledger/work_log.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sodium.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

std::string work_log_path(const std::string& run_dir, int cluster, const std::string& name) {
  const std::string file = name.empty() ? "cluster" + std::to_string(cluster) : name;
  return (fs::path(run_dir) / "work" / (file + ".jsonl")).string();
}

std::string work_log_name_from_environment() {
  const char* name = std::getenv("CROSSTRAIN_WORK_LOG_NAME");
  if (!name || !*name) return "";
  for (const char* c = name; *c; ++c)
    if (!std::isalnum(static_cast<unsigned char>(*c)) && *c != '-' && *c != '_' && *c != '.')
      throw UsageError(std::string("CROSSTRAIN_WORK_LOG_NAME = '") + name +
                       "' may hold only letters, digits and - _ . (it names the cluster's work log)");
  return name;
}

std::string work_record_json(const WorkRecord& r) {
  char time[32];
  std::snprintf(time, sizeof time, "%.3f", r.time);
  // Written by hand to keep the keys in this order and the time in milliseconds.
  return "{\"step\":" + std::to_string(r.step) + ",\"tokens\":" + std::to_string(r.tokens) +
         ",\"bytes\":" + std::to_string(r.bytes) + ",\"digest\":\"" + r.digest + "\",\"time\":" + time + "}";
}

namespace {

WorkRecord parse_record(const std::string& line, const std::string& where) {
  WorkRecord r;
  try {
    const auto j = nlohmann::json::parse(line);
    r.step = j.at("step").get<int64_t>();
    r.tokens = j.at("tokens").get<int64_t>();
    r.bytes = j.at("bytes").get<int64_t>();
    r.digest = j.at("digest").get<std::string>();
    r.time = j.at("time").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": not a work record (" + e.what() + "); expected {\"step\", \"tokens\", \"bytes\", "
                "\"digest\", \"time\"} as written by run.work_log = true");
  }
  if (r.step < 0 || r.tokens < 0 || r.bytes < 0 || r.digest.size() != 64 ||
      r.digest.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw Error(where + ": a negative count or a digest that is not 64 lowercase hex digits");
  return r;
}

}  // namespace

std::vector<WorkRecord> read_work_log(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UsageError("cannot read the work log '" + path + "': does the run write it (run.work_log = true), and is "
                     "the cluster index right (RUN_DIR/work/cluster<K>.jsonl)?");
  std::stringstream text;
  text << in.rdbuf();
  const std::string all = text.str();
  std::map<int64_t, WorkRecord> by_step;
  size_t start = 0;
  for (int64_t line = 1; start < all.size(); ++line) {
    const size_t end = all.find('\n', start);
    if (end == std::string::npos) break;  // the writer is in the middle of this line: read it next time
    if (end > start) {
      WorkRecord r = parse_record(all.substr(start, end - start), path + " line " + std::to_string(line));
      by_step[r.step] = std::move(r);
    }
    start = end + 1;
  }
  std::vector<WorkRecord> out;
  for (auto& [step, r] : by_step) out.push_back(std::move(r));
  return out;
}

std::string gradient_digest(const std::vector<at::Tensor>& parameters) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise (sodium_init)");
  crypto_hash_sha256_state state;
  crypto_hash_sha256_init(&state);
  for (const auto& p : parameters) {
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    const at::Tensor f = g.detach().to(at::kCPU, at::kFloat).contiguous();
    crypto_hash_sha256_update(&state, static_cast<const unsigned char*>(f.data_ptr()),
                              static_cast<unsigned long long>(f.numel()) * sizeof(float));
  }
  unsigned char out[crypto_hash_sha256_BYTES];
  crypto_hash_sha256_final(&state, out);
  char hex[2 * crypto_hash_sha256_BYTES + 1];
  sodium_bin2hex(hex, sizeof hex, out, sizeof out);
  return hex;
}

std::unique_ptr<WorkLog> WorkLog::open(comm::Communicator& world, const std::string& run_dir, int cluster,
                                       int64_t counted_tokens_per_step) {
  std::unique_ptr<WorkLog> log(new WorkLog());
  log->cluster_ = std::max(cluster, 0);
  // Every rank's cluster and counted tokens: who is first in its cluster, and what the cluster processes.
  at::Tensor mine = at::tensor({static_cast<int64_t>(log->cluster_), counted_tokens_per_step}, at::kLong);
  at::Tensor all = at::zeros({2 * world.size()}, at::kLong);
  world.all_gather(mine, all)->wait();
  const int64_t* v = all.data_ptr<int64_t>();
  int first = -1;
  for (int r = 0; r < world.size(); ++r) {
    if (v[2 * r] != log->cluster_) continue;
    if (first < 0) first = r;
    log->cluster_tokens_ += v[2 * r + 1];
  }
  log->path_ = work_log_path(run_dir, log->cluster_, work_log_name_from_environment());
  if (first != world.rank()) return log;
  std::error_code ec;
  fs::create_directories(fs::path(log->path_).parent_path(), ec);
  log->fd_ = ::open(log->path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log->fd_ < 0)
    throw Error("run.work_log: cannot open '" + log->path_ + "' for appending: " + std::strerror(errno) +
                "; check that run.dir is writable");
  return log;
}

WorkLog::~WorkLog() {
  if (fd_ >= 0) ::close(fd_);
}

void WorkLog::record(int64_t step, const std::string& digest, int64_t bytes) {
  if (fd_ < 0) return;
  WorkRecord r;
  r.step = step;
  r.tokens = cluster_tokens_;
  r.bytes = bytes;
  r.digest = digest;
  r.time = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string line = work_record_json(r) + "\n";
  // O_APPEND and one write: a reader (ledger claim, running meanwhile) sees whole lines or an incomplete last one.
  const ssize_t n = ::write(fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()))
    throw Error("run.work_log: writing step " + std::to_string(step) + " to '" + path_ + "' failed: " +
                (n < 0 ? std::strerror(errno) : "short write") + "; is the disk full?");
}

}  // namespace crosstrain::train
