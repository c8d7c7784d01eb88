#include "crosstrain/elastic/abortable.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "crosstrain/elastic/membership.h"

namespace crosstrain::elastic {
namespace {

using comm::Communicator;
using comm::Millis;
using comm::ReduceOp;
using comm::WorkPtr;

// Waits for works that cannot be woken to look at `ended` (Gloo's point to point reports completion only from
// inside its own wait): threads of the communicator take such waits off their callers, which watch `ended` as for
// any other work. One thread per wait in progress: callers that wait at the same time (a parameter server's
// threads, one per worker, and its own worker) must not queue behind each other's waits, which end only when
// their peers send. Threads idle for kIdle end. A wait given up on stays with its thread until the back end's
// timeout or the peer's closed connection ends it, and keeps the operation's buffers alive until then.
class Waiter {
 public:
  ~Waiter() {
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->stop = true;
    }
    // Each thread ends by itself once idle (one still inside a wait given up on finishes it within the timeout).
    state_->wake.notify_all();
  }

  // True once `work` is done (its error rethrown), false as soon as stop() says so.
  bool wait(const WorkPtr& work, Millis timeout, const std::function<bool()>& stop) {
    auto job = std::make_shared<Job>();
    job->work = work;
    job->timeout = timeout;
    {
      std::lock_guard<std::mutex> lock(state_->mu);
      state_->queue.push_back(job);
      if (static_cast<int>(state_->queue.size()) > state_->idle) {
        std::thread([state = state_] { run(*state); }).detach();
      }
    }
    state_->wake.notify_one();
    std::unique_lock<std::mutex> lock(state_->mu);
    while (!state_->done.wait_for(lock, Millis(20), [&] { return job->finished; }))
      if (stop()) return false;
    if (job->error) std::rethrow_exception(job->error);
    return true;
  }

 private:
  struct Job {
    WorkPtr work;
    Millis timeout{0};
    bool finished = false;
    std::exception_ptr error;
  };
  static constexpr std::chrono::seconds kIdle{2};
  struct State {
    std::mutex mu;
    std::condition_variable wake, done;
    std::deque<std::shared_ptr<Job>> queue;
    int idle = 0;  // threads waiting for a job
    bool stop = false;
  };

  static void run(State& s) {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(s.mu);
        ++s.idle;
        // A thread left idle for a while ends: the pool is as large as the waits that overlapped, not for good.
        s.wake.wait_for(lock, kIdle, [&] { return s.stop || !s.queue.empty(); });
        --s.idle;
        if (s.queue.empty()) return;
        job = std::move(s.queue.front());
        s.queue.pop_front();
      }
      std::exception_ptr error;
      try {
        job->work->wait(job->timeout);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(s.mu);
        job->error = error;
        job->finished = true;
      }
      s.done.notify_all();
    }
  }

  std::shared_ptr<State> state_ = std::make_shared<State>();
};

class AbortableWork : public comm::Work {
 public:
  AbortableWork(WorkPtr inner, const EndedFn& ended, std::shared_ptr<Waiter> waiter, CommContext context,
                Millis timeout)
      : Work(timeout), inner_(std::move(inner)), ended_(ended), waiter_(std::move(waiter)),
        context_(std::move(context)) {}

  void wait(Millis timeout) override {
    if (inner_->is_completed()) return inner_->wait(timeout);
    (void)wait_unless(timeout, [] { return false; });
  }

  // The back end wakes this thread when the operation ends, and every 20 ms to look at `ended` (polling the
  // operation instead cost ~6% of a gpt-tiny step on 2 cores: the wake-ups of 4 ranks compete with their
  // compute). Gloo collectives and the shared-memory and algorithm workers can; the rest (point to point) is
  // waited for on the communicator's waiter thread. A wrapper around this one gets the same (no second thread).
  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override {
    const auto stop = [&] { return give_up() || ended_() != 0; };
    std::optional<bool> done = inner_->wait_unless(timeout, stop);
    if (!done.has_value()) done = waiter_->wait(inner_, timeout, stop);
    if (!*done && ended_() != 0) throw GenerationEnded(context_, ended_());
    return done;
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  EndedFn ended_;
  std::shared_ptr<Waiter> waiter_;
  CommContext context_;
};

class AbortableCommunicator : public Communicator {
 public:
  AbortableCommunicator(std::unique_ptr<Communicator> inner, EndedFn ended)
      : Communicator(inner->backend(), inner->name(), inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)), ended_(std::move(ended)) {}

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
  // Point to point too (a heal's transfer to a joiner that died, a pipeline neighbour that hung): its waits go
  // through the waiter thread.
  WorkPtr send(const at::Tensor& t, int dst, int tag) override { return wrap("send", inner_->send(t, dst, tag), dst); }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return wrap("recv", inner_->recv(t, src, tag), src); }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_->split(ranks);
    return sub ? std::make_unique<AbortableCommunicator>(std::move(sub), ended_) : nullptr;
  }

 private:
  WorkPtr wrap(const char* op, WorkPtr work, int peer = -1) {
    if (work->is_completed()) return work;
    return std::make_shared<AbortableWork>(std::move(work), ended_, waiter_, context(op, peer), timeout());
  }

  std::unique_ptr<Communicator> inner_;
  EndedFn ended_;
  std::shared_ptr<Waiter> waiter_ = std::make_shared<Waiter>();
};

}  // namespace

std::unique_ptr<comm::Communicator> make_abortable(std::unique_ptr<comm::Communicator> inner, EndedFn ended) {
  return std::make_unique<AbortableCommunicator>(std::move(inner), std::move(ended));
}

}  // namespace crosstrain::elastic
