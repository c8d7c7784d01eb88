// The bytes of requests the rendezvous store holds in memory at once, over all connections. Each connection
// takes a share as a message's bytes actually arrive and gives it back once the reply is sent, so a thousand
// clients announcing the largest message cost nothing, and a thousand sending one at once cost at most the
// budget: the others wait (each within its own message deadline) instead of growing the launcher without
// bound. Internal to src/comm.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>

namespace crosstrain::comm::store {

class ByteBudget {
 public:
  explicit ByteBudget(size_t limit) : limit_(limit) {}

  // Takes `n` bytes, waiting until they are free; false at `deadline` or once closed.
  bool acquire(size_t n, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    freed_.wait_until(lock, deadline, [&] { return closed_ || used_ + n <= limit_; });
    if (closed_ || used_ + n > limit_) return false;
    used_ += n;
    return true;
  }
  void release(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= n;
    freed_.notify_all();
  }
  // Fails every acquire, now and later: the server is shutting down.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    freed_.notify_all();
  }
  size_t used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return used_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable freed_;
  size_t limit_;
  size_t used_ = 0;
  bool closed_ = false;
};

// What one connection holds of a ByteBudget; gives it all back when destroyed.
class BudgetLease {
 public:
  explicit BudgetLease(ByteBudget& budget) : budget_(budget) {}
  ~BudgetLease() { budget_.release(held_); }
  BudgetLease(const BudgetLease&) = delete;
  BudgetLease& operator=(const BudgetLease&) = delete;

  bool grow(size_t n, std::chrono::steady_clock::time_point deadline) {
    if (!budget_.acquire(n, deadline)) return false;
    held_ += n;
    return true;
  }

 private:
  ByteBudget& budget_;
  size_t held_ = 0;
};

}  // namespace crosstrain::comm::store
