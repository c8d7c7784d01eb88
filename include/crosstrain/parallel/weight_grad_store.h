// Zero-bubble pipelines' weight-gradient store (Qi et al. 2023; Megatron's "WeightGradStore").
//
// A linear layer's backward is two independent products: the input gradient dX = dY W, which the previous
// stage waits for, and the weight gradient dW = dY^T X, which nobody waits for. Linear layers built with a store
// (`linear_with_store`) compute only dX while the store captures, and keep (X, dY) instead; the schedule's
// weight action later turns each kept pair into dW with one matrix product. Outside a capture they are plain
// linear layers, with plain autograd results.
//
//   store.begin_capture(key);   backward of the micro-batch (input gradients, small parameters' gradients)
//   store.end_capture();
//   ... later, in a bubble ...
//   store.apply(key);           dW += dY^T X and db += sum dY for every linear layer, accumulated by autograd
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace crosstrain::parallel {

class WeightGradStore {
 public:
  using Key = std::pair<int, int>;  // (micro-batch, chunk)

  // Until end_capture, the linear layers of this store defer their weight gradients under `key`.
  void begin_capture(Key key);
  void end_capture();
  bool capturing() const;

  // Called by a linear layer's backward while capturing.
  void defer(const at::Tensor& weight, const at::Tensor& bias, at::Tensor input, at::Tensor output_grad);

  // Computes the weight (and bias) gradients kept under `key` and accumulates them into the parameters' .grad
  // through autograd, so gradient hooks (data-parallel overlap, ZeRO) see them as any other gradient. Returns
  // how many products it ran. Throws if nothing was kept under `key` and `key` was never captured.
  int apply(Key key);
  // Pairs kept and not applied yet (for tests and for a step that ends early).
  size_t pending() const;
  void clear();

 private:
  struct Deferred {
    at::Tensor weight, bias, input, output_grad;
  };
  mutable std::mutex mutex_;
  bool capturing_ = false;
  Key current_{-1, -1};
  std::map<Key, std::vector<Deferred>> kept_;
};

// y = x W^T + b (bias may be undefined). With `store` null, or when it is not capturing at backward time, the
// same gradients as at::linear; while capturing, the weight and bias gradients are deferred to the store.
at::Tensor linear_with_store(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             WeightGradStore* store);

}  // namespace crosstrain::parallel
