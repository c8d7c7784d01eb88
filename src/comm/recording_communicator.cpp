#include "crosstrain/comm/recording.h"

#include <atomic>
#include <chrono>
#include <thread>

#include "crosstrain/comm/hang_doctor.h"

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

// A timeout gets the hang doctor's diagnosis (which ranks never reached the operation) added to its cause.
[[noreturn]] void rethrow_diagnosed(const CommError& e, const OpRecord& record, const GroupInfo& info) {
  if (!e.timed_out() || !info.doctor) throw e;
  const std::string diagnosis = info.doctor->diagnose(record, info.name, info.members);
  throw CommError(e.context(), e.cause() + ". " + diagnosis, true);
}

class RecordingWork : public Work {
 public:
  RecordingWork(WorkPtr inner, OpRecord record, std::shared_ptr<const GroupInfo> info, Millis timeout)
      : Work(timeout), inner_(std::move(inner)), record_(record), info_(std::move(info)) {}
  // Never waited for: completed if the back end says so, else abandoned (an error unwound past it).
  ~RecordingWork() override {
    if (!finished_.load()) finish(inner_->is_completed() ? OpState::Completed : OpState::Failed);
  }

  void wait(Millis timeout) override {
    if (finished_.load()) return inner_->wait(timeout);
    const int64_t t0 = monotonic_us();
    if (record_.wait_start_us < 0) record_.wait_start_us = t0;
    try {
      inner_->wait(timeout);
    } catch (const CommError& e) {
      info_->recorder->add_blocked(monotonic_us() - t0);
      fail(e);
    }
    info_->recorder->add_blocked(monotonic_us() - t0);
    finish(OpState::Completed);
  }

  bool is_completed() override {
    const bool done = inner_->is_completed();
    if (done && finished_at_ < 0) finished_at_ = monotonic_us();
    return done;
  }

  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    const int64_t t0 = monotonic_us();
    if (record_.wait_start_us < 0) record_.wait_start_us = t0;
    std::optional<bool> done;
    try {
      done = inner_->wait_unless(timeout, give_up);
    } catch (const CommError& e) {
      info_->recorder->add_blocked(monotonic_us() - t0);
      fail(e);
    }
    info_->recorder->add_blocked(monotonic_us() - t0);
    if (done && *done) finish(OpState::Completed);
    return done;
  }

 private:
  void finish(OpState state) {
    if (finished_.exchange(true)) return;
    record_.finished_us = finished_at_ >= 0 ? finished_at_ : monotonic_us();
    info_->recorder->finish(record_, state);
  }

  [[noreturn]] void fail(const CommError& e) {
    finish(OpState::Failed);
    rethrow_diagnosed(e, record_, *info_);
  }

  WorkPtr inner_;
  OpRecord record_;
  std::shared_ptr<const GroupInfo> info_;
  std::atomic<bool> finished_{false};
  int64_t finished_at_ = -1;
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
    r.step = step_;
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
  // lost in other work would; its peers time out and must name it. Bounded, like every wait.
  void hold_back_if_asked(const char* op) {
    if (options_.hold_back_step < 0 || step_ != options_.hold_back_step || held_back_) return;
    held_back_ = true;
    options_.recorder->set_activity("a held-back collective (debug.skip_collective)");
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(10);
    while (std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    fail(op, "held back by debug.skip_collective for 10 minutes");
  }

  Communicator& inner_;
  std::unique_ptr<Communicator> owned_;
  RecordingOptions options_;
  std::shared_ptr<const GroupInfo> info_;
  int64_t step_ = -1;
  bool held_back_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_recording(Communicator& world, RecordingOptions options) {
  if (!options.recorder) throw Error("make_recording: a flight recorder is required");
  std::vector<int> members(world.size());
  for (int r = 0; r < world.size(); ++r) members[r] = r;
  return std::make_unique<RecordingCommunicator>(world, nullptr, std::move(members), options);
}

}  // namespace crosstrain::comm
