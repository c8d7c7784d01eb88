// Private to src/comm: running a communicator's own operations in order on one thread, so that they stay
// asynchronous behind the Work interface (the shared-memory all-reduce, the algorithm communicator).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
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

 private:
  CommContext context_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false, started_ = false;
  std::chrono::steady_clock::time_point started_at_;
  std::exception_ptr error_;
};

// Jobs run one after another in the order they were submitted, on one thread (or, when nothing is queued or
// running, in the caller's: see run_inline_if_idle). The destructor finishes the queued jobs first.
class SerialWorker {
 public:
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

  void submit(std::function<void()> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(job));
    cv_.notify_all();
  }

  // Runs `job` now in this thread if no job is queued or running, keeping the order; returns false (and runs
  // nothing) otherwise. Saves two thread hand-offs on latency-bound operations.
  bool run_inline_if_idle(const std::function<void()>& job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!queue_.empty() || busy_) return false;
      busy_ = true;
    }
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
      // Only the worker waits on cv_, and only for queued jobs: waking it for nothing costs a context switch.
      if (!queue_.empty()) cv_.notify_all();
    }
    if (error) std::rethrow_exception(error);
    return true;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        cv_.wait(lock, [&] { return !busy_ && (stop_ || !queue_.empty()); });  // idle until work (no peer wait)
        if (queue_.empty()) return;
        job = std::move(queue_.front());
        queue_.pop_front();
        busy_ = true;
      }
      try {
        job();
      } catch (...) {
        // Jobs report their errors through their Work; one that escapes must not end the process.
      }
      std::lock_guard<std::mutex> lock(mutex_);
      busy_ = false;
    }
  }

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool stop_ = false;
  bool busy_ = false;  // a job is running (on the worker or inline)
  std::thread thread_;  // last: starts after the members above exist
};

}  // namespace crosstrain::comm
