#include "crosstrain/parallel/tp_layers.h"

#include <ATen/ATen.h>

#include "crosstrain/parallel/tensor_parallel.h"

namespace crosstrain::parallel {

at::Tensor enter_column_region(const at::Tensor& x, const TensorParallel& t) {
  // Every rank needs the whole input (its backward sums the ranks' input gradients).
  return t.sequence_parallel ? tp::gather_from_sequence(x, t.group) : tp::copy_to_region(x, t.group);
}

at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const TensorParallel& t) {
  return linear_with_store(enter_column_region(x, t), weight, bias, t.weight_grads);
}

at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const TensorParallel& t) {
  // Without a group the bias stays in the fused product, as in the single-device layer.
  if (!t.group) return linear_with_store(x, weight, bias, t.weight_grads);
  at::Tensor partial = linear_with_store(x, weight, at::Tensor(), t.weight_grads);
  at::Tensor out = t.sequence_parallel ? tp::reduce_scatter_to_sequence(partial, t.group)
                                       : tp::reduce_from_region(partial, t.group);
  return bias.defined() ? out + bias : out;
}

at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight, const TensorParallel& t) {
  const int64_t local_vocab = weight.size(0), start = t.rank * local_vocab;
  // Tokens outside this rank's slice look up row 0 and are zeroed: the sum over ranks is the full lookup.
  at::Tensor local = tokens - start;
  at::Tensor outside = (local < 0).logical_or(local >= local_vocab);
  at::Tensor emb = at::embedding(weight, local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0);
  return t.sequence_parallel ? tp::reduce_scatter_to_sequence(emb, t.group) : tp::reduce_from_region(emb, t.group);
}

}  // namespace crosstrain::parallel
