// Tensor-parallel layers in functional form (Megatron's ColumnParallelLinear, RowParallelLinear and
// VocabParallelEmbedding): the caller owns the weight shards, these apply the layer and its communication.
// Shards: a column-parallel weight holds rows [rank * out/tp, (rank+1) * out/tp) of the full [out, in] weight;
// a row-parallel weight holds the same columns of the input dimension; a vocabulary-parallel embedding holds
// rows [rank * V/tp, (rank+1) * V/tp).
#pragma once

#include <ATen/core/Tensor.h>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/weight_grad_store.h"

namespace crosstrain::parallel {

struct TensorParallel {
  comm::Communicator* group = nullptr;  // null: no tensor parallelism (every layer is the plain one)
  int rank = 0;
  int size = 1;
  bool sequence_parallel = false;       // activations outside the layers are split along the sequence (dim 1)
  // Zero-bubble schedules: the linear layers defer their weight gradients to this store (null: plain layers).
  WeightGradStore* weight_grads = nullptr;
};

// The input every column-parallel layer of a region reads: x itself (its backward sums the ranks' input
// gradients), or x gathered along the sequence. Layers that read the same x (Llama's q, k and v; gate and
// up) enter once and apply linear_with_store each, so the gradient is summed once.
at::Tensor enter_column_region(const at::Tensor& x, const TensorParallel& tp);
// x (replicated, or a sequence shard) -> this rank's slice of the output features.
at::Tensor column_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                  const TensorParallel& tp);
// this rank's slice of the input features -> full output (or its sequence shard); the bias is added once.
at::Tensor row_parallel_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                               const TensorParallel& tp);
// tokens [B, T] -> embeddings [B, T, d] (or [B, T/tp, d] with sequence parallelism).
at::Tensor vocab_parallel_embedding(const at::Tensor& tokens, const at::Tensor& weight, const TensorParallel& tp);

}  // namespace crosstrain::parallel
