#include "crosstrain/train/site_stager.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/train/checkpoint_sites.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kStageTag = 0x57a6e;
constexpr int kReportTag = 0x57a6f;
constexpr int kMaxRounds = 64;
constexpr int64_t kMaxReportBytes = int64_t{8} << 20;
constexpr size_t kReportedCommitted = 2;  // the newest committed steps a site reports (the holders of last resort)
constexpr size_t kReportedStaging = 16;

// One stager at a time works in a site's checkpoints folder: a generation that ended may still be finishing a
// local commit while the next one's stager starts (flock: also between two descriptors of one process).
class SiteLock {
 public:
  SiteLock(const fs::path& root, std::chrono::seconds patience) {
    fs::create_directories(root);
    const fs::path path = root / ".staging.lock";
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
    const auto deadline = Clock::now() + patience;
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (Clock::now() > deadline) {
        ::close(fd_);
        throw Error("another stager held " + path.string() + " for " + std::to_string(patience.count()) + " s");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~SiteLock() { ::close(fd_); }
  SiteLock(const SiteLock&) = delete;
  SiteLock& operator=(const SiteLock&) = delete;

 private:
  int fd_ = -1;
};

std::optional<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// step_00000042 or step_00000042.staging: the step; nullopt for anything else.
std::optional<int64_t> step_of(const std::string& name, const std::string& suffix) {
  const std::string prefix = "step_";
  if (name.size() != prefix.size() + 8 + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string digits = name.substr(prefix.size(), 8);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

std::map<std::string, StagedFile> files_of(const nlohmann::json& files) {
  std::map<std::string, StagedFile> out;
  for (const auto& [name, f] : files.items()) out[name] = StagedFile{f.at(0).get<int64_t>(), f.at(1).get<std::string>()};
  return out;
}

int64_t size_or_zero(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

// A committed checkpoint made by a stager (its manifest's info lists the files), as a holder of its files.
std::optional<StepHolding> committed_holding(const fs::path& dir, int64_t step) {
  const auto manifest = read_json(dir / "manifest.json");
  if (!manifest || !manifest->contains("info") || !(*manifest)["info"].contains("site_files")) return std::nullopt;
  StepHolding h{step, true, files_of((*manifest)["info"]["site_files"]), {}};
  for (const auto& [name, f] : h.files) h.have[name] = size_or_zero(dir / name) == f.size ? f.size : 0;
  return h;
}

// A copy being gathered: a file under its own name is whole (its site's own, or checked on arrival); NAME.part is
// what arrived of it so far.
std::optional<StepHolding> staging_holding(const fs::path& dir, int64_t step) {
  const auto staging = read_json(dir / kStagingFile);
  if (!staging || !staging->contains("files")) return std::nullopt;
  StepHolding h{step, false, files_of((*staging)["files"]), {}};
  for (const auto& [name, f] : h.files) {
    if (fs::exists(dir / name)) {
      h.have[name] = size_or_zero(dir / name) == f.size ? f.size : 0;
    } else if (const int64_t part = size_or_zero(dir / (name + ".part")); part > 0) {
      h.have[name] = std::min(part, f.size - 1);  // never "whole" before its checksum held
    }
  }
  return h;
}

// This site's report; copies older than its newest committed checkpoint are removed first (never needed again).
SiteInventory scan(const fs::path& root, const std::string& run_dir) {
  std::vector<StepHolding> committed, staging;
  std::vector<std::pair<int64_t, fs::path>> staging_dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto step = step_of(name, "")) {
      if (auto h = committed_holding(entry.path(), *step)) committed.push_back(std::move(*h));
    } else if (const auto staged = step_of(name, ".staging")) {
      staging_dirs.emplace_back(*staged, entry.path());
    }
  }
  int64_t newest = -1;
  for (const StepHolding& h : committed) newest = std::max(newest, h.step);
  if (const auto latest = checkpoint::latest_checkpoint(root.parent_path().string()))
    newest = std::max(newest, step_of(fs::path(*latest).filename().string(), "").value_or(-1));
  for (const auto& [step, dir] : staging_dirs) {
    std::optional<StepHolding> h = step > newest ? staging_holding(dir, step) : std::nullopt;
    if (h) {
      staging.push_back(std::move(*h));
    } else {
      fs::remove_all(dir, ec);  // superseded, or unreadable
    }
  }
  const auto newest_first = [](const StepHolding& a, const StepHolding& b) { return a.step > b.step; };
  std::sort(committed.begin(), committed.end(), newest_first);
  std::sort(staging.begin(), staging.end(), newest_first);
  SiteInventory inventory;
  for (size_t i = 0; i < committed.size() && i < kReportedCommitted; ++i) inventory.steps.push_back(committed[i]);
  for (size_t i = 0; i < staging.size() && i < kReportedStaging; ++i) inventory.steps.push_back(staging[i]);
  for (const std::string& name : kStagedOutputs) {
    int64_t size = 0;
    const std::string sum = file_checksum((fs::path(run_dir) / name).string(), &size);
    if (!sum.empty()) inventory.outputs[name] = StagedFile{size, sum};
  }
  return inventory;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// The FNV-1a state after the first `bytes` of a file (a resumed transfer continues the sum).
std::optional<Fnv1a> sum_of_prefix(const fs::path& path, int64_t bytes) {
  Fnv1a sum;
  if (bytes == 0) return sum;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> buffer(1 << 20);
  for (int64_t at = 0; at < bytes && in;) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(buffer.size()), bytes - at);
    in.read(reinterpret_cast<char*>(buffer.data()), len);
    if (in.gcount() != len) return std::nullopt;
    sum.add(buffer.data(), static_cast<size_t>(len));
    at += len;
  }
  return in ? std::optional<Fnv1a>(sum) : std::nullopt;
}

// debug: a test holds every stager before its first transfer until this file exists (at most a minute).
void hold_if_asked(const std::string& path) {
  if (path.empty()) return;
  const auto until = Clock::now() + std::chrono::minutes(1);
  while (!fs::exists(path) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

}  // namespace

std::string staging_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / (checkpoint::step_dir_name(step) + ".staging")).string();
}

SiteStager::SiteStager(std::unique_ptr<comm::Communicator> leaders, StagerOptions options)
    : leaders_(std::move(leaders)), o_(std::move(options)), me_(leaders_->rank()) {
  thread_ = std::thread([this] { loop(); });
}

SiteStager::~SiteStager() {
  stop_ = true;
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void SiteStager::adopt(int64_t step) { post({Kind::Adopt, step}); }
void SiteStager::resume() { post({Kind::Resume, 0}); }

void SiteStager::drain() {
  std::lock_guard<std::mutex> lock(mu_);
  drain_target_ = ++posted_;
  events_.push_back({Kind::Drain, 0});
  cv_.notify_all();
}

std::optional<std::string> SiteStager::drained(std::chrono::milliseconds patience) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, patience, [&] { return done_ >= drain_target_ || ended_; });
  if (done_ >= drain_target_) return "";
  if (ended_) return failure_;
  return std::nullopt;
}

StagingStats SiteStager::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void SiteStager::post(Event e) {
  std::lock_guard<std::mutex> lock(mu_);
  ++posted_;
  events_.push_back(e);
  cv_.notify_all();
}

void SiteStager::loop() {
  for (;;) {
    Event e;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !events_.empty(); });
      if (stop_) break;
      e = events_.front();
      events_.pop_front();
    }
    try {
      handle(e);
    } catch (const std::exception& ex) {
      // The leaders' rounds are collective: one that fails leaves the others out of step, so staging stops for
      // this placement (what is half staged stays for the next one).
      std::lock_guard<std::mutex> lock(mu_);
      failure_ = ex.what();
      if (!stop_) std::fprintf(stderr, "checkpoint staging between sites stopped: %s\n", ex.what());
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (failure_.empty()) failure_ = "the stager was stopped";
  ended_ = true;
  cv_.notify_all();
}

void SiteStager::handle(const Event& e) {
  if (e.kind == Kind::Adopt) {
    const fs::path root = fs::path(o_.run_dir) / "checkpoints";
    SiteLock lock(root, std::chrono::seconds(120));
    const fs::path from = checkpoint::temp_checkpoint_dir(o_.run_dir, e.step), to = staging_dir(o_.run_dir, e.step);
    std::error_code ec;
    fs::remove_all(to, ec);  // an earlier placement's copy of this step: its files are not this one's
    fs::rename(from, to);
  }
  series();
}

void SiteStager::series() {
  const fs::path root = fs::path(o_.run_dir) / "checkpoints";
  SiteLock lock(root, std::chrono::seconds(120));
  Series state;
  for (int r = 0; r < kMaxRounds && !stop_; ++r)
    if (!round(state)) break;
}

// One round: reports, the plan, its transfers, then this site's commits. False once there is nothing more to do
// (or the plan is the last round's: the same transfers failed again, e.g. a file that arrives changed).
bool SiteStager::round(Series& series) {
  const std::vector<SiteInventory> all = exchange(scan(fs::path(o_.run_dir) / "checkpoints", o_.run_dir));
  std::vector<Transfer> plan = plan_staging(all);
  // Once the checkpoints are where they can go, the run's outputs follow, once per series.
  const bool outputs = plan.empty() && !series.outputs_sent;
  if (outputs) {
    plan = plan_outputs(all);
    series.outputs_sent = true;
  }
  if (plan.empty() || plan == series.previous) {
    chunks_in_flight_ = 0;
    commit_whole_copies();
    return false;
  }
  if (!held_) {
    hold_if_asked(o_.faults.stage_hold_file);
    held_ = true;
  }
  chunks_in_flight_ = 0;
  for (const Transfer& t : plan)
    chunks_in_flight_ += (t.whole.size - t.offset + o_.chunk_bytes - 1) / o_.chunk_bytes;
  // A transfer's first chunk waits for the transfers before it (its peers may be busy in them), a chunk's time each.
  int64_t before = 0;
  for (const Transfer& t : plan) {
    move(t, leaders_->timeout() * (1 + before));
    before += (t.whole.size - t.offset + o_.chunk_bytes - 1) / o_.chunk_bytes;
  }
  commit_whole_copies();
  series.previous = std::move(plan);
  return !outputs;
}

// Every leader's report, on every leader, through the first leader. Point to point, because its waits are the
// ones given (a collective's are the group's timeout): a leader may wait here while the others still move the last
// round's files over a slow link. Peers' reports are checked.
std::vector<SiteInventory> SiteStager::exchange(const SiteInventory& mine) {
  const int n = leaders_->size();
  std::vector<std::string> texts(n);
  texts[me_] = inventory_to_json(mine).dump();
  if (me_ == 0) {
    for (int s = 1; s < n; ++s) texts[s] = receive_text(s, round_timeout());
    const std::string all = nlohmann::json(texts).dump();
    for (int s = 1; s < n; ++s) send_text(all, s, leaders_->timeout());
  } else {
    send_text(texts[me_], 0, round_timeout());
    try {
      texts = nlohmann::json::parse(receive_text(0, round_timeout())).get<std::vector<std::string>>();
    } catch (const nlohmann::json::exception& e) {
      throw Error("the first site's list of checkpoint reports is no list of texts: " + std::string(e.what()));
    }
    if (static_cast<int>(texts.size()) != n) throw Error("the first site's list of checkpoint reports is not one a site");
  }
  std::vector<SiteInventory> out;
  for (int s = 0; s < n; ++s) {
    if (s == me_) {
      out.push_back(mine);
      continue;
    }
    try {
      out.push_back(inventory_from_json(nlohmann::json::parse(texts[s])));
    } catch (const nlohmann::json::exception& e) {
      throw Error("site " + std::to_string(s) + "'s checkpoint report is no JSON: " + e.what());
    }
  }
  return out;
}

void SiteStager::send_text(const std::string& text, int to, comm::Millis first_wait) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  wait(leaders_->send(length, to, kReportTag), first_wait);
  at::Tensor bytes = at::empty({std::max<int64_t>(1, static_cast<int64_t>(text.size()))}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  wait(leaders_->send(bytes, to, kReportTag), leaders_->timeout());
}

std::string SiteStager::receive_text(int from, comm::Millis first_wait) {
  at::Tensor length = at::empty({1}, at::kLong);
  wait(leaders_->recv(length, from, kReportTag), first_wait);
  const int64_t n = length.item<int64_t>();
  if (n < 0 || n > kMaxReportBytes * leaders_->size())
    throw Error("site " + std::to_string(from) + " announced a checkpoint report of " + std::to_string(n) + " bytes");
  at::Tensor bytes = at::empty({std::max<int64_t>(1, n)}, at::kByte);
  wait(leaders_->recv(bytes, from, kReportTag), leaders_->timeout());
  const char* p = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  return std::string(p, p + n);
}

void SiteStager::move(const Transfer& t, comm::Millis first_wait) {
  if (me_ == t.from) send_file(t, first_wait);
  if (me_ == t.to) receive_file(t, first_wait);
}

void SiteStager::send_file(const Transfer& t, comm::Millis first_wait) {
  fs::path path = t.step < 0 ? fs::path(o_.run_dir) / t.file : fs::path(staging_dir(o_.run_dir, t.step)) / t.file;
  if (!fs::exists(path)) path = fs::path(checkpoint::final_checkpoint_dir(o_.run_dir, t.step)) / t.file;
  std::ifstream in(path, std::ios::binary);
  in.seekg(t.offset);
  at::Tensor chunk = at::zeros({std::max<int64_t>(1, std::min(o_.chunk_bytes, t.whole.size - t.offset))}, at::kByte);
  int64_t chunks = 0;
  for (int64_t at = t.offset; at < t.whole.size; at += o_.chunk_bytes, ++chunks) {
    if (o_.faults.stage_cut_chunks >= 0 && chunks == o_.faults.stage_cut_chunks)
      throw Error("(a test's fault) the link was cut sending " + t.file);
    const int64_t len = std::min(o_.chunk_bytes, t.whole.size - at);
    at::Tensor piece = chunk.narrow(0, 0, len);
    // A file that shrank or went missing since the report still sends its length (the receiver's checksum fails).
    in.read(reinterpret_cast<char*>(piece.data_ptr<uint8_t>()), len);
    wait(leaders_->send(piece, t.to, kStageTag), chunks == 0 ? first_wait : leaders_->timeout());
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_sent += len;
  }
}

void SiteStager::receive_file(const Transfer& t, comm::Millis first_wait) {
  std::error_code ec;
  if (t.step < 0) {
    // An output, written in place (readers drop a torn last line); when it does not check, it starts over.
    const fs::path path = fs::path(o_.run_dir) / t.file;
    const std::string failure = receive_into(t, path, first_wait);
    if (failure.empty()) return;
    fs::resize_file(path, 0, ec);
    std::fprintf(stderr, "checkpoint staging: %s from site %d %s; it will be sent whole\n", t.file.c_str(), t.from,
                 failure.c_str());
    return;
  }
  const fs::path dir = staging_dir(o_.run_dir, t.step), part = dir / (t.file + ".part");
  const std::string failure = receive_into(t, part, first_wait);
  if (failure.empty()) {
    fs::rename(part, dir / t.file);
    return;
  }
  // Next round sends it again, from the start (the plan repeats only if nothing else changed: then it stops).
  fs::remove(part, ec);
  std::fprintf(stderr, "checkpoint staging: %s of step %lld from site %d %s; it will be sent again\n", t.file.c_str(),
               static_cast<long long>(t.step), t.from, failure.c_str());
}

// Receives `t` into `path` after its first t.offset bytes (kept). Returns "" once the whole file matches its
// checksum, else what went wrong.
std::string SiteStager::receive_into(const Transfer& t, const fs::path& path, comm::Millis first_wait) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  std::optional<Fnv1a> sum = ::ftruncate(fd, t.offset) == 0 ? sum_of_prefix(path, t.offset) : std::nullopt;
  bool written = sum.has_value() && ::lseek(fd, t.offset, SEEK_SET) == t.offset;
  at::Tensor chunk = at::empty({std::max<int64_t>(1, std::min(o_.chunk_bytes, t.whole.size - t.offset))}, at::kByte);
  int64_t chunks = 0;
  for (int64_t at = t.offset; at < t.whole.size; at += o_.chunk_bytes, ++chunks) {
    if (o_.faults.stage_cut_chunks >= 0 && chunks == o_.faults.stage_cut_chunks) {
      ::fsync(fd);
      ::close(fd);
      throw Error("(a test's fault) the link was cut receiving " + t.file);
    }
    const int64_t len = std::min(o_.chunk_bytes, t.whole.size - at);
    at::Tensor piece = chunk.narrow(0, 0, len);
    wait(leaders_->recv(piece, t.from, kStageTag), chunks == 0 ? first_wait : leaders_->timeout());
    if (sum) sum->add(piece.data_ptr<uint8_t>(), static_cast<size_t>(len));
    written = written && write_all(fd, piece.data_ptr<uint8_t>(), static_cast<size_t>(len));
  }
  written = written && ::fsync(fd) == 0;
  written = ::close(fd) == 0 && written;
  if (!written) return "could not be written here";
  if (!sum || sum->hex() != t.whole.checksum) return "arrived changed (its checksum does not match)";
  std::lock_guard<std::mutex> lock(mu_);
  stats_.bytes_received += t.whole.size - t.offset;
  stats_.bytes_resumed += t.offset;
  return "";
}

// Each staged copy that is whole becomes this site's checkpoint, unless a newer placement fenced the run off it.
void SiteStager::commit_whole_copies() {
  const fs::path root = fs::path(o_.run_dir) / "checkpoints";
  for (const StepHolding& h : scan(root, o_.run_dir).steps) {
    if (h.committed || !h.complete()) continue;
    const std::string dir = staging_dir(o_.run_dir, h.step);
    const std::string refusal = fence_refusal(o_.run_dir, o_.fence);
    std::error_code ec;
    if (!refusal.empty()) {
      fs::remove_all(dir, ec);
      std::fprintf(stderr, "checkpoint of step %lld not committed at this site: %s\n", static_cast<long long>(h.step),
                   refusal.c_str());
      continue;
    }
    const auto staging = read_json(fs::path(dir) / kStagingFile);
    if (!staging) continue;
    const std::string committed = checkpoint::commit_checkpoint(
        o_.run_dir, h.step, checkpoint::records_from_json((*staging)["records"]), (*staging)["info"], o_.keep_last,
        o_.faults, dir);
    std::printf("checkpoint of step %lld is whole at this site: %s\n", static_cast<long long>(h.step),
                committed.c_str());
    std::fflush(stdout);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps_committed;
  }
}

// Waits for one of the stager's operations; gives up when the stager is stopped.
void SiteStager::wait(const comm::WorkPtr& work, comm::Millis timeout) const {
  const std::optional<bool> done = work->wait_unless(timeout, [this] { return stop_.load(); });
  if (!done) {
    work->wait(timeout);
  } else if (!*done) {
    throw Error("the stager was stopped");
  }
}

// The first exchange of a round waits for the others' transfers of the last one: a chunk's timeout each.
comm::Millis SiteStager::round_timeout() const {
  return leaders_->timeout() * (1 + chunks_in_flight_) + comm::Millis(60000);
}

}  // namespace crosstrain::train
