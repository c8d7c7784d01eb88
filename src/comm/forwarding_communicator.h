// Private to src/comm: a communicator in front of another one (the shared-memory all-reduce, the algorithm
// communicator). Every operation goes to the wrapped communicator unless the subclass takes it; the training step
// is passed on, so the wrapped back end's errors name it too. split() wraps each sub-group with wrap_group().
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

class ForwardingCommunicator : public Communicator {
 public:
  void set_step(int64_t step) override {
    Communicator::set_step(step);
    inner_->set_step(step);
  }

  WorkPtr broadcast(at::Tensor& t, int root) override { return inner_->broadcast(t, root); }
  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override { return inner_->reduce(t, root, op); }
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override { return inner_->all_reduce(t, op); }
  WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override { return inner_->gather(in, out, root); }
  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override { return inner_->all_gather(in, out); }
  WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override { return inner_->scatter(in, out, root); }
  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    return inner_->reduce_scatter(in, out, op);
  }
  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override { return inner_->all_to_all(in, out); }
  WorkPtr barrier() override { return inner_->barrier(); }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override { return inner_->send(t, dst, tag); }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_->split(ranks);
    return sub ? wrap_group(std::move(sub)) : nullptr;
  }

 protected:
  // The backend name becomes "<inner's>+<suffix>".
  ForwardingCommunicator(std::unique_ptr<Communicator> inner, const std::string& suffix)
      : Communicator(inner->backend() + "+" + suffix, inner->name(), inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)) {}
  // The same wrapper around a sub-group of the wrapped communicator (collective over the sub-group).
  virtual std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> sub) = 0;

  std::unique_ptr<Communicator> inner_;
};

}  // namespace crosstrain::comm
