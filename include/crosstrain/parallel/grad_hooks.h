// The autograd plumbing shared by the gradient reducers that overlap communication with backward
// (BucketedAllReduce, ZeroOptimizer): a call as soon as each parameter's gradient is accumulated, and one call
// when the backward pass is over. On libtorch 1.13 (ARCHITECTURE.md, "libtorch notes") that is a post-hook on
// each parameter's grad accumulator, which only fires while someone keeps the accumulator alive, plus a
// callback queued on the autograd engine from inside a hook, which the engine runs when the pass ends.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace crosstrain::parallel {

class GradientHooks {
 public:
  // on_ready(i): parameters[i]'s gradient has just been accumulated (on the autograd thread). It returns whether
  // the gradient counts for a reduction (false while accumulating micro-batches without sync). The first one
  // that counts opens a pass and queues on_backward_end, which runs once, after the whole backward pass.
  GradientHooks(const std::vector<at::Tensor>& parameters, std::function<bool(size_t)> on_ready,
                std::function<void()> on_backward_end);
  // Our hooks and queued callback can outlive us: an autograd graph keeps the accumulators it uses, and a
  // backward pass already running keeps its callbacks. From here on they do nothing. (They are not removed
  // from the accumulators: a backward running right now may be iterating over them.)
  ~GradientHooks();
  GradientHooks(const GradientHooks&) = delete;
  GradientHooks& operator=(const GradientHooks&) = delete;

  // The owner's reduction pass: open from the first gradient that counted (or begin_pass) until end_pass.
  bool in_pass() const;
  // Opens a pass without a backward (no end-of-backward callback): for reducing gradients accumulated
  // without sync.
  void begin_pass();
  // The owner's reduction is complete: the next gradient that counts opens a new pass.
  void end_pass();

  // Runs `fn` when the gradient of the (non-leaf) `tensor` has been computed, before it flows further back;
  // disarmed together with the accumulator hooks.
  void on_gradient(const at::Tensor& tensor, std::function<void()> fn) const;

 private:
  struct State;
  static void gradient_ready(const std::shared_ptr<State>& s, size_t index);

  std::shared_ptr<State> state_;  // shared with every hook and callback; outlives us as long as they do
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // our hooks fire only while these live
};

}  // namespace crosstrain::parallel
