#include "crosstrain/elastic/abortable.h"

#include <optional>

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

  void wait(Millis timeout) override {
    if (inner_->is_completed()) return inner_->wait(timeout);
    // The back end wakes this thread when the operation ends, and every 20 ms to look at `ended` (polling the
    // operation instead cost ~6% of a gpt-tiny step on 2 cores: the wake-ups of 4 ranks compete with their
    // compute). Every work of a generation's groups can (Gloo collectives, the shared-memory and algorithm
    // workers); one that cannot is waited for plainly, bounded by the group's timeout.
    const std::optional<bool> done = inner_->wait_unless(timeout, [this] { return ended_() != 0; });
    if (!done.has_value()) return inner_->wait(timeout);
    if (!*done) throw GenerationEnded(context_, ended_());
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
