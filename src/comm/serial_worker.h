// Private to src/comm: running a communicator's own operations in order on one thread, so that they stay
// asynchronous behind the Work interface (the shared-memory all-reduce, the algorithm communicator).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// A Work that another thread completes. The operation bounds each of its own steps by the timeout and reports
// the missing peer itself; wait() is the backstop: it counts the timeout (twice, plus a second, as an operation
// has several steps) from when the operation started, not from when it was queued behind others, and gives up on
// one that has not started after ten timeouts.
class DeferredWork : public Work {
 public:
  DeferredWork(Millis timeout, CommContext context) : Work(timeout), context_(std::move(context)) {}
  void wait(Millis timeout) override {
    using Clock = std::chrono::steady_clock;
    const auto called = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      if (cv_.wait_for(lock, Millis(200), [&] { return done_; })) break;
      const auto now = Clock::now();
      const bool stuck = started_ ? now - started_at_ > 2 * timeout + Millis(1000) : now - called > 10 * timeout;
      if (stuck) {
        CommContext c = context_;
        c.timeout = timeout;
        throw CommError(c, started_ ? "the operation did not complete" : "the operation never started", true);
      }
    }
    if (error_) std::rethrow_exception(error_);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }
  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    const auto deadline = std::chrono::steady_clock::now() + 2 * timeout + Millis(1000);
    std::unique_lock<std::mutex> lock(mutex_);
    while (!cv_.wait_for(lock, Millis(20), [&] { return done_; })) {
      if (give_up()) return false;
      if (std::chrono::steady_clock::now() > deadline) break;  // wait() below reports it, as it always does
    }
    lock.unlock();
    wait(timeout);
    return true;
  }
  void complete(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = error;
    cv_.notify_all();
  }
  // Runs `job` and completes with its exception, if any.
  void run(const std::function<void()>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      started_ = true;
      started_at_ = std::chrono::steady_clock::now();
    }
    try {
      job();
      complete(nullptr);
    } catch (...) {
      complete(std::current_exception());
    }
  }
  const CommContext& context() const { return context_; }
  // What went wrong, as one line (the error's cause, or its message); empty when it succeeded or is running.
  std::string failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) return {};
    try {
      std::rethrow_exception(error_);
    } catch (const CommError& e) {
      return describe(e.context(), e.cause());
    } catch (const std::exception& e) {
      return e.what();
    } catch (...) {
      return "unknown error";
    }
  }

 private:
  CommContext context_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, started_ = false;
  std::chrono::steady_clock::time_point started_at_;
  std::exception_ptr error_;
};

// Operations run one after another in the order they were submitted, on one thread (or, when nothing is queued
// or running, in the caller's: see run_inline_if_idle). The destructor finishes the queued operations first.
//
// The first operation that fails latches the worker as broken, like an aborted NCCL communicator: the peers of
// a group that timed out or lost a rank are out of step, so every later operation fails at once, naming the
// first failure, instead of waiting out its own timeout. Without this, a stopped peer behind N queued gradient
// buckets was reported after N timeouts (each queued operation waited in turn, also while the process unwound).
class SerialWorker {
 public:
  using Job = std::function<void()>;

  SerialWorker() : thread_([this] { loop(); }) {}
  ~SerialWorker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
      cv_.notify_all();
    }
    thread_.join();
  }
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // Queues `job`, which completes `work` (with the job's exception, if any).
  void submit(std::shared_ptr<DeferredWork> work, Job job) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(work), std::move(job)});
    cv_.notify_all();
  }

  // Runs `job` now in this thread if no job is queued or running, keeping the order; returns false (and runs
  // nothing) otherwise. Saves two thread hand-offs on latency-bound operations.
  bool run_inline_if_idle(const std::shared_ptr<DeferredWork>& work, const Job& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!queue_.empty() || busy_) return false;
      busy_ = true;
    }
    execute(*work, job);
    std::lock_guard<std::mutex> lock(mutex_);
    busy_ = false;
    // Only the worker waits on cv_, and only for queued jobs: waking it for nothing costs a context switch.
    if (!queue_.empty()) cv_.notify_all();
    return true;
  }

  // The first failure's message; empty while every operation has succeeded.
  std::string first_failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return first_failure_;
  }

 private:
  struct Entry {
    std::shared_ptr<DeferredWork> work;
    Job job;
  };

  // Runs one operation, or fails it at once when an earlier one failed; latches the first failure.
  void execute(DeferredWork& work, const Job& job) {
    const std::string earlier = first_failure();
    if (!earlier.empty()) {
      work.complete(std::make_exception_ptr(
          CommError(work.context(), "not started: an earlier operation of this group failed (" + earlier + ")")));
      return;
    }
    work.run(job);
    const std::string failure = work.failure();
    if (failure.empty()) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (first_failure_.empty()) first_failure_ = failure;
  }

  void loop() {
    for (;;) {
      Entry entry;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !busy_ && (stop_ || !queue_.empty()); });  // idle until work (no peer wait)
        if (queue_.empty()) return;
        entry = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      execute(*entry.work, entry.job);
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Entry> queue_;
  std::string first_failure_;
  bool stop_ = false;
  bool busy_ = false;  // a job is running (on the worker or inline)
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace crosstrain::comm
