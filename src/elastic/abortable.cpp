#include "crosstrain/elastic/abortable.h"

#include <chrono>
#include <thread>

#include "crosstrain/elastic/membership.h"

namespace crosstrain::elastic {
namespace {

using comm::Communicator;
using comm::Millis;
using comm::ReduceOp;
using comm::WorkPtr;

class AbortableWork : public comm::Work {
 public:
  AbortableWork(WorkPtr inner, const EndedFn& ended, CommContext context, Millis timeout)
      : Work(timeout), inner_(std::move(inner)), ended_(ended), context_(std::move(context)) {}

  // Polls rather than blocks: a Gloo wait that times out marks its group broken, so the wait cannot be sliced.
  // The sleep grows from 50 us to 1 ms, which keeps the added latency of a fast collective small.
  void wait(Millis timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::microseconds(50);
    while (!inner_->is_completed()) {
      if (const int64_t successor = ended_()) throw GenerationEnded(context_, successor);
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) break;  // the back end's own wait reports the timeout, naming the peer
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::microseconds(1000));
    }
    const auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
    inner_->wait(std::max(left, Millis(1)));
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkPtr inner_;
  EndedFn ended_;
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
  // Point to point is not wrapped: Gloo reports a send or recv complete only from inside its wait, so it cannot
  // be polled. A dead peer's closed connection ends it with an error; a hung one within the group's timeout.
  WorkPtr send(const at::Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_->split(ranks);
    return sub ? std::make_unique<AbortableCommunicator>(std::move(sub), ended_) : nullptr;
  }

 private:
  WorkPtr wrap(const char* op, WorkPtr work, int peer = -1) {
    if (work->is_completed()) return work;
    return std::make_shared<AbortableWork>(std::move(work), ended_, context(op, peer), timeout());
  }

  std::unique_ptr<Communicator> inner_;
  EndedFn ended_;
};

}  // namespace

std::unique_ptr<comm::Communicator> make_abortable(std::unique_ptr<comm::Communicator> inner, EndedFn ended) {
  return std::make_unique<AbortableCommunicator>(std::move(inner), std::move(ended));
}

}  // namespace crosstrain::elastic
