#include "crosstrain/train/site_stager.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/elastic/abortable.h"
#include "site_folder.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kStageTag = 0x57a6e;
constexpr int kReportTag = 0x57a6f;
constexpr int kMaxRounds = 64;
constexpr int64_t kMaxReportBytes = int64_t{8} << 20;
constexpr auto kLockPatience = std::chrono::seconds(120);

// debug: a test holds every stager before its first transfer until this file exists (at most a minute).
void hold_if_asked(const std::string& path, const std::atomic<bool>& stop) {
  if (path.empty()) return;
  const auto until = Clock::now() + std::chrono::minutes(1);
  while (!fs::exists(path) && !stop && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
}

int64_t chunks_of(const Transfer& t, int64_t chunk_bytes) {
  return (t.whole.size - t.offset + chunk_bytes - 1) / chunk_bytes;
}

}  // namespace

std::string staging_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / (checkpoint::step_dir_name(step) + ".staging")).string();
}

struct SiteStager::Core {
  enum class Kind { Adopt, Replace, Resume, Drain };
  struct Event {
    Kind kind = Kind::Resume;
    int64_t step = 0;
  };
  struct Series {
    std::vector<Transfer> previous;  // the last round's plan: the same again twice means no progress
    int repeats = 0;
    int outputs_rounds = 0;
  };

  Core(std::unique_ptr<comm::Communicator> group, StagerOptions options)
      : o(std::move(options)), me(group->rank()), timeout(group->timeout()) {
    // Gloo's sends and receives cannot be woken: the abortable wrapper waits for them on threads of its own, so a
    // stop ends this thread's wait at once (the operation given up keeps its buffers until the group's timeout).
    leaders = elastic::make_abortable(std::move(group), [this] { return stop.load() ? int64_t{1} : int64_t{0}; });
  }

  std::unique_ptr<comm::Communicator> leaders;
  const StagerOptions o;
  const int me;
  const comm::Millis timeout;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;
  int64_t posted = 0, done = 0, drain_target = 0;
  std::string failure;  // why the thread stopped ("" while it runs)
  bool ended = false;   // the thread has returned
  StagingStats stats;
  std::atomic<bool> stop{false};
  int64_t chunks_in_flight = 0;          // of the last round's plan: the next exchange waits for them
  bool held = false;                     // debug: the test's hold was waited for
  std::set<std::string> resend_whole;   // outputs whose copy here did not check
  bool resumed = false;                  // the first series (what an earlier generation left) is done

  fs::path root() const { return fs::path(o.run_dir) / "checkpoints"; }
  SiteInventory scan() const { return scan_site(o.run_dir, o.fence, resend_whole); }

  void post(Event e) {
    std::lock_guard<std::mutex> lock(mu);
    ++posted;
    if (e.kind == Kind::Drain) drain_target = posted;
    events.push_back(e);
    cv.notify_all();
  }

  void loop();
  void handle(const Event& e);
  void series();
  bool round(Series& series);
  void check_whole_everywhere();
  std::vector<SiteInventory> exchange(const SiteInventory& mine);
  void send_text(const std::string& text, int to, comm::Millis first_wait);
  std::string receive_text(int from, comm::Millis first_wait);
  void move(const Transfer& t, comm::Millis first_wait);
  void send_file(const Transfer& t, comm::Millis first_wait);
  void receive_file(const Transfer& t, comm::Millis first_wait);
  std::string receive_into(const Transfer& t, const fs::path& path, comm::Millis first_wait);
  void commit_whole_copies();
  void wait(const comm::WorkPtr& work, comm::Millis limit) const { work->wait(limit); }
  comm::Millis round_timeout() const { return timeout * (1 + chunks_in_flight) + comm::Millis(60000); }
};

SiteStager::SiteStager(std::unique_ptr<comm::Communicator> leaders, StagerOptions options)
    : core_(std::make_shared<Core>(std::move(leaders), std::move(options))) {
  thread_ = std::thread([core = core_] { core->loop(); });
}

SiteStager::~SiteStager() {
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    core_->stop = true;
  }
  core_->cv.notify_all();
  thread_.join();  // every wait of the thread watches `stop`; a local commit in progress finishes first
  // What the thread gave up on may still be in use until the group's timeout: the state goes only after it.
  std::thread([core = std::move(core_)] { std::this_thread::sleep_for(core->timeout + std::chrono::seconds(1)); })
      .detach();
}

void SiteStager::adopt(int64_t step) {
  const fs::path tmp = checkpoint::temp_checkpoint_dir(core_->o.run_dir, step);
  const fs::path staging = staging_dir(core_->o.run_dir, step);
  bool resumed = false;
  {
    std::lock_guard<std::mutex> lock(core_->mu);
    resumed = core_->resumed;
  }
  // Renamed here, so a checkpoint whose commit returned is staged even if this generation ends before the thread
  // gets to it. The thread renames it instead while it still resumes what an earlier generation left (newest
  // first would otherwise drop that for this one before it is finished), and when an earlier copy of the step
  // (a placement that saved it before) is there to replace.
  if (!resumed || fs::exists(staging)) return core_->post({Core::Kind::Replace, step});
  fs::rename(tmp, staging);
  core_->post({Core::Kind::Adopt, step});
}

void SiteStager::resume() { core_->post({Core::Kind::Resume, 0}); }
void SiteStager::drain() { core_->post({Core::Kind::Drain, 0}); }

std::optional<std::string> SiteStager::drained(std::chrono::milliseconds patience) {
  std::unique_lock<std::mutex> lock(core_->mu);
  core_->cv.wait_for(lock, patience, [&] { return core_->done >= core_->drain_target || core_->ended; });
  if (core_->done >= core_->drain_target) return "";
  if (core_->ended) return core_->failure;
  return std::nullopt;
}

StagingStats SiteStager::stats() const {
  std::lock_guard<std::mutex> lock(core_->mu);
  return core_->stats;
}

void SiteStager::Core::loop() {
  for (;;) {
    Event e;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop.load() || !events.empty(); });
      if (stop) break;
      e = events.front();
      events.pop_front();
    }
    try {
      handle(e);
    } catch (const std::exception& ex) {
      // The leaders' rounds are collective: one that fails leaves the others out of step, so staging stops for
      // this generation (what is half staged stays for the next one).
      std::lock_guard<std::mutex> lock(mu);
      failure = ex.what();
      if (!stop) std::fprintf(stderr, "checkpoint staging between sites stopped: %s\n", ex.what());
      break;
    }
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  }
  std::lock_guard<std::mutex> lock(mu);
  if (failure.empty()) failure = "the stager was stopped";
  ended = true;
  cv.notify_all();
}

void SiteStager::Core::handle(const Event& e) {
  if (e.kind == Kind::Replace) {
    SiteLock lock(root(), kLockPatience);
    const fs::path from = checkpoint::temp_checkpoint_dir(o.run_dir, e.step), to = staging_dir(o.run_dir, e.step);
    std::error_code ec;
    fs::remove_all(to, ec);  // an earlier placement's copy of this step: its files are not this one's
    if (fs::exists(from)) fs::rename(from, to);
  }
  series();
  if (e.kind == Kind::Resume) {
    std::lock_guard<std::mutex> lock(mu);
    resumed = true;
  }
  if (e.kind == Kind::Drain) check_whole_everywhere();
}

void SiteStager::Core::series() {
  SiteLock lock(root(), kLockPatience);
  Series state;
  for (int r = 0; r < kMaxRounds && !stop; ++r)
    if (!round(state)) break;
}

// One round: reports, the plan, its transfers, then this site's commits. False once there is nothing more to do,
// or the same transfers failed twice (a file that keeps arriving changed).
bool SiteStager::Core::round(Series& series) {
  const std::vector<SiteInventory> all = exchange(scan());
  std::vector<Transfer> plan = plan_staging(all);
  // Once the checkpoints are where they can go, the run's outputs follow: once per series, and once more for what
  // grew meanwhile or did not check.
  const bool outputs = plan.empty() && series.outputs_rounds < 2;
  if (outputs) plan = plan_outputs(all);
  series.repeats = !plan.empty() && plan == series.previous ? series.repeats + 1 : 0;
  if (plan.empty() || series.repeats > 1) {
    chunks_in_flight = 0;
    commit_whole_copies();
    return false;
  }
  if (outputs) ++series.outputs_rounds;
  if (!held) {
    hold_if_asked(o.faults.stage_hold_file, stop);
    held = true;
  }
  chunks_in_flight = 0;
  for (const Transfer& t : plan) chunks_in_flight += chunks_of(t, o.chunk_bytes);
  // A transfer's first chunk waits for the transfers before it (its peers may be busy in them), a chunk's time each.
  int64_t before = 0;
  for (const Transfer& t : plan) {
    move(t, timeout * (1 + before));
    before += chunks_of(t, o.chunk_bytes);
  }
  commit_whole_copies();
  series.previous = std::move(plan);
  return true;
}

// At the end of a run: every site that reported holds the newest checkpoint of this placement, committed.
void SiteStager::Core::check_whole_everywhere() {
  const std::vector<SiteInventory> all = exchange(scan());
  int64_t newest = -1;
  for (const SiteInventory& site : all)
    for (const StepHolding& h : site.steps)
      if (h.origin == o.fence) newest = std::max(newest, h.step);
  if (newest < 0) return;  // nothing of this placement anywhere: nothing a site could lack
  for (size_t s = 0; s < all.size(); ++s) {
    const bool whole = std::any_of(all[s].steps.begin(), all[s].steps.end(), [&](const StepHolding& h) {
      return h.committed && h.step == newest && h.origin == o.fence;
    });
    if (!whole)
      throw Error("site " + std::to_string(s) + " does not hold the checkpoint of step " + std::to_string(newest) +
                  " whole (fenced off there, or no site could send it every file)");
  }
}

// Every leader's report, on every leader, through the first leader. Point to point, because its waits are the
// ones given (a collective's are the group's timeout): a leader may wait here while the others still move the last
// round's files over a slow link. The first leader checks each report before it passes the lot on.
std::vector<SiteInventory> SiteStager::Core::exchange(const SiteInventory& mine) {
  const int n = leaders->size();
  std::vector<SiteInventory> out(n);
  out[me] = mine;
  const auto checked = [&](const std::string& text, int s) {
    try {
      return inventory_from_json(nlohmann::json::parse(text));
    } catch (const nlohmann::json::exception& e) {
      throw Error("site " + std::to_string(s) + "'s checkpoint report is no JSON: " + e.what());
    }
  };
  if (me == 0) {
    nlohmann::json all = nlohmann::json::array();
    for (int s = 0; s < n; ++s) {
      if (s != 0) out[s] = checked(receive_text(s, round_timeout()), s);
      all.push_back(inventory_to_json(out[s]));
    }
    const std::string text = all.dump();
    for (int s = 1; s < n; ++s) send_text(text, s, timeout);
    return out;
  }
  send_text(inventory_to_json(mine).dump(), 0, round_timeout());
  nlohmann::json all;
  try {
    all = nlohmann::json::parse(receive_text(0, round_timeout()));
  } catch (const nlohmann::json::exception& e) {
    throw Error("the first site's checkpoint reports are no JSON: " + std::string(e.what()));
  }
  if (!all.is_array() || static_cast<int>(all.size()) != n) throw Error("the first site's reports are not one a site");
  for (int s = 0; s < n; ++s)
    if (s != me) out[s] = inventory_from_json(all[s]);
  return out;
}

void SiteStager::Core::send_text(const std::string& text, int to, comm::Millis first_wait) {
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  wait(leaders->send(length, to, kReportTag), first_wait);
  at::Tensor bytes = at::empty({std::max<int64_t>(1, static_cast<int64_t>(text.size()))}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  wait(leaders->send(bytes, to, kReportTag), timeout);
}

std::string SiteStager::Core::receive_text(int from, comm::Millis first_wait) {
  at::Tensor length = at::empty({1}, at::kLong);
  wait(leaders->recv(length, from, kReportTag), first_wait);
  const int64_t n = length.item<int64_t>();
  if (n < 0 || n > kMaxReportBytes * leaders->size())
    throw Error("site " + std::to_string(from) + " announced checkpoint reports of " + std::to_string(n) + " bytes");
  at::Tensor bytes = at::empty({std::max<int64_t>(1, n)}, at::kByte);
  wait(leaders->recv(bytes, from, kReportTag), timeout);
  const char* p = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  return std::string(p, p + n);
}

void SiteStager::Core::move(const Transfer& t, comm::Millis first_wait) {
  if (me == t.from) send_file(t, first_wait);
  if (me == t.to) receive_file(t, first_wait);
}

void SiteStager::Core::send_file(const Transfer& t, comm::Millis first_wait) {
  fs::path path = t.step < 0 ? fs::path(o.run_dir) / t.file : fs::path(staging_dir(o.run_dir, t.step)) / t.file;
  if (!fs::exists(path)) path = fs::path(checkpoint::final_checkpoint_dir(o.run_dir, t.step)) / t.file;
  std::ifstream in(path, std::ios::binary);
  in.seekg(t.offset);
  at::Tensor chunk = at::zeros({std::max<int64_t>(1, std::min(o.chunk_bytes, t.whole.size - t.offset))}, at::kByte);
  int64_t chunks = 0;
  for (int64_t at = t.offset; at < t.whole.size; at += o.chunk_bytes, ++chunks) {
    if (o.faults.stage_cut_chunks >= 0 && chunks == o.faults.stage_cut_chunks)
      throw Error("(a test's fault) the link was cut sending " + t.file);
    const int64_t len = std::min(o.chunk_bytes, t.whole.size - at);
    at::Tensor piece = chunk.narrow(0, 0, len);
    // A file that shrank or went missing since the report still sends its length (the receiver's checksum fails).
    in.read(reinterpret_cast<char*>(piece.data_ptr<uint8_t>()), len);
    wait(leaders->send(piece, t.to, kStageTag), chunks == 0 ? first_wait : timeout);
    std::lock_guard<std::mutex> lock(mu);
    stats.bytes_sent += len;
  }
}

void SiteStager::Core::receive_file(const Transfer& t, comm::Millis first_wait) {
  std::error_code ec;
  if (t.step < 0) {
    // An output: into NAME.part (after a copy of the bytes kept), then in place of the old copy.
    const fs::path path = fs::path(o.run_dir) / t.file, part = fs::path(o.run_dir) / (t.file + ".part");
    if (t.offset > 0) fs::copy_file(path, part, fs::copy_options::overwrite_existing, ec);
    const std::string failure = ec ? "could not be copied here" : receive_into(t, part, first_wait);
    if (failure.empty()) {
      fs::rename(part, path);
      resend_whole.erase(t.file);
      return;
    }
    fs::remove(part, ec);
    resend_whole.insert(t.file);  // the bytes kept may be what differed: the next copy comes whole
    std::fprintf(stderr, "checkpoint staging: %s from site %d %s; it will be sent whole\n", t.file.c_str(), t.from,
                 failure.c_str());
    return;
  }
  const fs::path dir = staging_dir(o.run_dir, t.step), part = dir / (t.file + ".part");
  const std::string failure = receive_into(t, part, first_wait);
  if (failure.empty()) {
    fs::rename(part, dir / t.file);
    return;
  }
  // The next round sends it again, from the start (a plan repeated twice ends the series).
  fs::remove(part, ec);
  std::fprintf(stderr, "checkpoint staging: %s of step %lld from site %d %s; it will be sent again\n", t.file.c_str(),
               static_cast<long long>(t.step), t.from, failure.c_str());
}

// Receives `t` into `path` after its first t.offset bytes (kept). Returns "" once the whole file matches its
// checksum, else what went wrong.
std::string SiteStager::Core::receive_into(const Transfer& t, const fs::path& path, comm::Millis first_wait) {
  Descriptor fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (fd.get() < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  std::optional<Fnv1a> sum = ::ftruncate(fd.get(), t.offset) == 0 ? sum_of_prefix(path, t.offset) : std::nullopt;
  bool written = sum.has_value() && ::lseek(fd.get(), t.offset, SEEK_SET) == t.offset;
  at::Tensor chunk = at::empty({std::max<int64_t>(1, std::min(o.chunk_bytes, t.whole.size - t.offset))}, at::kByte);
  int64_t chunks = 0;
  for (int64_t at = t.offset; at < t.whole.size; at += o.chunk_bytes, ++chunks) {
    if (o.faults.stage_cut_chunks >= 0 && chunks == o.faults.stage_cut_chunks) {
      ::fsync(fd.get());
      throw Error("(a test's fault) the link was cut receiving " + t.file);
    }
    const int64_t len = std::min(o.chunk_bytes, t.whole.size - at);
    at::Tensor piece = chunk.narrow(0, 0, len);
    wait(leaders->recv(piece, t.from, kStageTag), chunks == 0 ? first_wait : timeout);
    if (sum) sum->add(piece.data_ptr<uint8_t>(), static_cast<size_t>(len));
    written = written && write_all(fd.get(), piece.data_ptr<uint8_t>(), static_cast<size_t>(len));
  }
  written = written && ::fsync(fd.get()) == 0;
  written = fd.close() && written;
  if (!written) return "could not be written here";
  if (!sum || sum->hex() != t.whole.checksum) return "arrived changed (its checksum does not match)";
  std::lock_guard<std::mutex> lock(mu);
  stats.bytes_received += t.whole.size - t.offset;
  stats.bytes_resumed += t.offset;
  return "";
}

// Each staged copy of this placement that is whole becomes this site's checkpoint, unless a newer placement fenced
// the run off it.
void SiteStager::Core::commit_whole_copies() {
  for (const StepHolding& h : scan_site(o.run_dir, o.fence, resend_whole, /*with_outputs=*/false).steps) {
    if (h.committed || !h.complete()) continue;
    const std::string dir = staging_dir(o.run_dir, h.step);
    const std::string refusal = fence_refusal(o.run_dir, o.fence);
    std::error_code ec;
    if (!refusal.empty()) {
      fs::remove_all(dir, ec);
      std::fprintf(stderr, "checkpoint of step %lld not committed at this site: %s\n", static_cast<long long>(h.step),
                   refusal.c_str());
      continue;
    }
    std::ifstream in(fs::path(dir) / kStagingFile);
    const nlohmann::json staging = nlohmann::json::parse(in, nullptr, false);
    if (staging.is_discarded() || !staging.contains("records") || !staging.contains("info")) continue;
    const std::string committed = checkpoint::commit_checkpoint(
        o.run_dir, h.step, checkpoint::records_from_json(staging["records"]), staging["info"], o.keep_last, o.faults,
        dir);
    std::printf("checkpoint of step %lld is whole at this site: %s\n", static_cast<long long>(h.step),
                committed.c_str());
    std::fflush(stdout);
    std::lock_guard<std::mutex> lock(mu);
    ++stats.steps_committed;
  }
}

}  // namespace crosstrain::train
