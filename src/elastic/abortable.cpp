#include "crosstrain/elastic/abortable.h"

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "crosstrain/elastic/membership.h"

namespace crosstrain::elastic {
namespace {

using comm::Communicator;
using comm::Millis;
using comm::ReduceOp;
using comm::WorkPtr;

// For works that cannot wake the waiting thread themselves (Work::wait_unless): waits for them on a thread of its
// own, one at a time, so that the training thread can sleep on a condition variable that either the completion or
// a short check of `ended` ends. Polling the operation instead cost ~6% of a gpt-tiny step on 2 cores (the
// wake-ups of 4 ranks compete with their compute); this costs two thread hand-offs per wait. A wait abandoned by an ended generation keeps the thread until Gloo gives up on it;
// the generation's communicators are dropped by then (elastic_trainer.cpp), so nothing waits behind it.
class Waiter {
 public:
  Waiter() : thread_([this] { loop(); }) {}
  ~Waiter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (busy_) thread_.detach();  // stuck in an abandoned wait: let it finish on its own
    else thread_.join();
  }

  // Runs inner->wait(timeout) on the waiter thread; returns once it is done (rethrowing its error) or once `ended`
  // names a successor (throws GenerationEnded).
  void wait(const WorkPtr& inner, Millis timeout, const EndedFn& ended, const CommContext& context) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !busy_ || stop_; });  // an abandoned wait still running: wait for it (bounded)
    job_ = inner;
    timeout_ = timeout;
    done_ = false;
    error_ = nullptr;
    busy_ = true;
    cv_.notify_all();
    while (!done_) {
      if (cv_.wait_for(lock, std::chrono::milliseconds(20), [&] { return done_; })) break;
      lock.unlock();
      const int64_t successor = ended();
      lock.lock();
      if (successor && !done_) throw GenerationEnded(context, successor);
    }
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || (busy_ && job_); });
      if (stop_ && !job_) return;
      WorkPtr job = std::move(job_);
      job_ = nullptr;
      lock.unlock();
      std::exception_ptr error;
      try {
        job->wait(timeout_);
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      error_ = error;
      done_ = true;
      busy_ = false;
      cv_.notify_all();
      if (stop_) return;
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  WorkPtr job_;
  Millis timeout_{0};
  bool busy_ = false, done_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

class AbortableWork : public comm::Work {
 public:
  AbortableWork(WorkPtr inner, std::shared_ptr<Waiter> waiter, const EndedFn& ended, CommContext context,
                Millis timeout)
      : Work(timeout), inner_(std::move(inner)), waiter_(std::move(waiter)), ended_(ended),
        context_(std::move(context)) {}

  void wait(Millis timeout) override {
    if (inner_->is_completed()) return inner_->wait(timeout);
    // The back end wakes this thread itself when it can; the waiter thread stands in when it cannot.
    const std::optional<bool> done = inner_->wait_unless(timeout, [this] { return ended_() != 0; });
    if (done.has_value()) {
      if (!*done) throw GenerationEnded(context_, ended_());
      return;
    }
    waiter_->wait(inner_, timeout, ended_, context_);
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  std::shared_ptr<Waiter> waiter_;
  EndedFn ended_;
  CommContext context_;
};

class AbortableCommunicator : public Communicator {
 public:
  AbortableCommunicator(std::unique_ptr<Communicator> inner, EndedFn ended, std::shared_ptr<Waiter> waiter)
      : Communicator(inner->backend(), inner->name(), inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)), ended_(std::move(ended)), waiter_(std::move(waiter)) {}

  void set_step(int64_t step) override {
    Communicator::set_step(step);
    inner_->set_step(step);
  }
  WorkPtr broadcast(at::Tensor& t, int root) override { return wrap("broadcast", inner_->broadcast(t, root), root); }
  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override { return wrap("reduce", inner_->reduce(t, root, op), root); }
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override { return wrap("allreduce", inner_->all_reduce(t, op)); }
  WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override {
    return wrap("gather", inner_->gather(in, out, root), root);
  }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    return wrap("allgather", inner_->all_gather(in, out));
  }
  WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override {
    return wrap("scatter", inner_->scatter(in, out, root), root);
  }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return wrap("reduce_scatter", inner_->reduce_scatter(in, out, op));
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    return wrap("alltoall", inner_->all_to_all(in, out));
  }
  WorkPtr barrier() override { return wrap("barrier", inner_->barrier()); }
  // Point to point is not wrapped: Gloo reports a send or recv complete only from inside its wait, so it cannot
  // be polled. A dead peer's closed connection ends it with an error; a hung one within the group's timeout.
  WorkPtr send(const at::Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_->split(ranks);
    return sub ? std::make_unique<AbortableCommunicator>(std::move(sub), ended_, waiter_) : nullptr;
  }

 private:
  WorkPtr wrap(const char* op, WorkPtr work, int peer = -1) {
    if (work->is_completed()) return work;
    return std::make_shared<AbortableWork>(std::move(work), waiter_, ended_, context(op, peer), timeout());
  }

  std::unique_ptr<Communicator> inner_;
  EndedFn ended_;
  std::shared_ptr<Waiter> waiter_;  // one for the world and all its sub-groups: the training thread waits on one at a time
};

}  // namespace

std::unique_ptr<comm::Communicator> make_abortable(std::unique_ptr<comm::Communicator> inner, EndedFn ended) {
  return std::make_unique<AbortableCommunicator>(std::move(inner), std::move(ended), std::make_shared<Waiter>());
}

}  // namespace crosstrain::elastic
