#include "crosstrain/comm/diagnostics/recording.h"

#include <atomic>
#include <chrono>
#include <thread>
#include <typeinfo>

#include "crosstrain/comm/diagnostics/hang_doctor.h"

namespace crosstrain::comm {
namespace {

int64_t bytes_of(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

// What every work of one group shares.
struct GroupInfo {
  std::shared_ptr<FlightRecorder> recorder;
  HangDoctor* doctor;
  int group;
  std::string name;
  std::vector<int> members;
};

// Inside a catch block only. A timeout gets the hang doctor's diagnosis (which ranks never reached the operation)
// added to its cause; anything else, and any subclass of CommError (it means something to its catcher, e.g.
// elastic's GenerationEnded), is rethrown as it is.
[[noreturn]] void rethrow_diagnosed(const CommError& e, const OpRecord& record, const GroupInfo& info) {
  if (!e.timed_out() || !info.doctor || typeid(e) != typeid(CommError)) throw;
  const std::string diagnosis = info.doctor->diagnose(record, info.name, info.members);
  throw CommError(e.context(), e.cause() + ". " + diagnosis, true);
}

class RecordingWork : public Work {
 public:
  RecordingWork(WorkPtr inner, OpRecord record, std::shared_ptr<const GroupInfo> info, Millis timeout)
      : Work(timeout), inner_(std::move(inner)), record_(record), info_(std::move(info)) {}
  // Never waited for: completed if the back end says so, else abandoned (an error unwound past it). Nothing may
  // escape a destructor.
  ~RecordingWork() override {
    try {
      if (!finished_.load()) finish(inner_->is_completed() ? OpState::Completed : OpState::Failed);
    } catch (...) {
    }
  }

  void wait(Millis timeout) override {
    if (finished_.load()) return inner_->wait(timeout);
    blocked_in([&] {
      inner_->wait(timeout);
      return true;
    });
  }

  bool is_completed() override {
    const bool done = inner_->is_completed();
    int64_t unset = -1;
    if (done) finished_at_.compare_exchange_strong(unset, monotonic_us());
    return done;
  }

  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    return blocked_in([&] { return inner_->wait_unless(timeout, give_up); });
  }

 private:
  // Runs a wait of the inner work, counting the time blocked; finishes the record when it is done.
  template <typename Wait>
  auto blocked_in(Wait wait) -> decltype(wait()) {
    const int64_t t0 = monotonic_us();
    int64_t unset = -1;
    wait_start_.compare_exchange_strong(unset, t0);
    try {
      auto done = wait();
      info_->recorder->add_blocked(monotonic_us() - t0);
      if (is_done(done)) finish(OpState::Completed);
      return done;
    } catch (const CommError& e) {
      info_->recorder->add_blocked(monotonic_us() - t0);
      finish(OpState::Failed);
      rethrow_diagnosed(e, record_, *info_);
    }
  }
  static bool is_done(bool done) { return done; }
  static bool is_done(const std::optional<bool>& done) { return done && *done; }

  void finish(OpState state) {
    if (finished_.exchange(true)) return;
    OpRecord r = record_;
    const int64_t at = finished_at_.load();
    r.finished_us = at >= 0 ? at : monotonic_us();
    r.wait_start_us = wait_start_.load();
    info_->recorder->finish(r, state);
  }

  WorkPtr inner_;
  const OpRecord record_;
  std::shared_ptr<const GroupInfo> info_;
  std::atomic<bool> finished_{false};
  // Written by whichever thread polls or waits, read by the one that finishes.
  std::atomic<int64_t> finished_at_{-1}, wait_start_{-1};
};

class RecordingCommunicator : public Communicator {
 public:
  RecordingCommunicator(Communicator& inner, std::unique_ptr<Communicator> owned, std::vector<int> members,
                        const RecordingOptions& options)
      : Communicator(inner.backend(), inner.name(), inner.rank(), inner.size(), inner.timeout()),
        inner_(inner), owned_(std::move(owned)), options_(options) {
    auto info = std::make_shared<GroupInfo>();
    info->recorder = options.recorder;
    info->doctor = options.doctor;
    info->name = inner.name();
    info->members = std::move(members);
    info->group = options.recorder->register_group(info->name, info->members);
    info_ = std::move(info);
  }

  void set_step(int64_t step) override {
    Communicator::set_step(step);
    step_ = step;
    inner_.set_step(step);
  }

  WorkPtr broadcast(at::Tensor& t, int root) override {
    return record("broadcast", bytes_of(t), root, [&] { return inner_.broadcast(t, root); });
  }
  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override {
    return record("reduce", bytes_of(t), root, [&] { return inner_.reduce(t, root, op); });
  }
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    return record("all_reduce", bytes_of(t), -1, [&] { return inner_.all_reduce(t, op); });
  }
  WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override {
    return record("gather", bytes_of(in), root, [&] { return inner_.gather(in, out, root); });
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    return record("all_gather", bytes_of(out), -1, [&] { return inner_.all_gather(in, out); });
  }
  WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override {
    return record("scatter", bytes_of(out) * size(), root, [&] { return inner_.scatter(in, out, root); });
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return record("reduce_scatter", bytes_of(in), -1, [&] { return inner_.reduce_scatter(in, out, op); });
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    return record("all_to_all", bytes_of(in), -1, [&] { return inner_.all_to_all(in, out); });
  }
  WorkPtr barrier() override {
    return record("barrier", 0, -1, [&] { return inner_.barrier(); });
  }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    return record("send", bytes_of(t), dst, [&] { return inner_.send(t, dst, tag); }, true);
  }
  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    return record("recv", bytes_of(t), src, [&] { return inner_.recv(t, src, tag); }, true);
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_.split(ranks);
    if (!sub) return nullptr;
    std::vector<int> members;
    for (int r : ranks) members.push_back(info_->members.at(r));
    Communicator& ref = *sub;
    return std::make_unique<RecordingCommunicator>(ref, std::move(sub), std::move(members), options_);
  }

 private:
  template <typename Start>
  WorkPtr record(const char* op, int64_t bytes, int peer, Start start, bool p2p = false) {
    if (!p2p) hold_back_if_asked(op);
    OpRecord r;
    r.op = op;
    r.p2p = p2p;
    r.group = info_->group;
    r.peer = peer;
    r.bytes = bytes;
    r.step = step_.load();
    r.issued_us = monotonic_us();
    r = info_->recorder->issue(r);
    WorkPtr inner;
    try {
      inner = start();
    } catch (const CommError& e) {
      // Some paths do their work in the call itself (small shared-memory all-reduces) and fail there.
      info_->recorder->add_blocked(monotonic_us() - r.issued_us);
      r.finished_us = monotonic_us();
      info_->recorder->finish(r, OpState::Failed);
      rethrow_diagnosed(e, r, *info_);
    }
    r.issue_end_us = monotonic_us();
    info_->recorder->add_blocked(r.issue_end_us - r.issued_us);
    return std::make_shared<RecordingWork>(std::move(inner), r, info_, timeout());
  }

  // debug.skip_collective: this rank never issues its first collective of the step and stays in it, as a rank
  // lost in other work would; its peers time out and must name it. It gives up after 10 minutes (the peers'
  // timeout ends the job long before).
  void hold_back_if_asked(const char* op) {
    if (options_.hold_back_step < 0 || step_.load() != options_.hold_back_step || held_back_.exchange(true)) return;
    options_.recorder->set_activity("a held-back collective (debug.skip_collective)");
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fail(op, "held back by debug.skip_collective for 10 minutes");
  }

  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;
  RecordingOptions options_;
  std::shared_ptr<const GroupInfo> info_;
  std::atomic<int64_t> step_{-1};    // set by the training thread, read by any thread that issues
  std::atomic<bool> held_back_{false};
};

}  // namespace

std::unique_ptr<Communicator> make_recording(Communicator& world, RecordingOptions options) {
  if (!options.recorder) throw Error("make_recording: a flight recorder is required");
  std::vector<int> members(world.size());
  for (int r = 0; r < world.size(); ++r) members[r] = r;
  return std::make_unique<RecordingCommunicator>(world, nullptr, std::move(members), options);
}

}  // namespace crosstrain::comm
