// Causal self-attention without the T x T score matrix: softmax(q k^T / sqrt(hd), future keys hidden) v.
//
// causal_attention is a FlashAttention-2 style kernel for CPU. Queries and keys are cut into tiles; each query
// tile walks the key tiles up to the diagonal with an online softmax (running row max and sum), so tiles above
// the diagonal are never computed (half the products of the dense path) and no buffer grows with T^2. The
// backward recomputes each tile's probabilities from the saved per-row log-sum-exp instead of keeping them.
// Products run as BLAS GEMMs on the tiles, the exponentials as vector loops; (batch, head) pairs run in parallel
// on libtorch's intra-op threads. Arithmetic is fp32: bf16 and fp16 inputs are widened, the results narrowed.
#pragma once

#include <ATen/ATen.h>

namespace crosstrain::models {

// q, k, v [B, H, T, hd] (any strides), same shape and dtype -> [B, H, T, hd] in that dtype; differentiable in all
// three. Scales by 1/sqrt(hd) itself: pass q unscaled. Double inputs take reference_causal_attention (the kernel
// is fp32 and would round them).
at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// The dense path, for attention dropout (which the fused kernel lacks) and as the reference the tests and
// `crosstrain bench attention` compare against: matmul, masked_fill(-inf), softmax, dropout, matmul.
// `mask` [>= T, >= T] bool, true where a query must not see a key (undefined: built here); `dropout` applies
// to the probabilities when `train`.
at::Tensor reference_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& mask = {}, double dropout = 0.0, bool train = false);

// Process-wide switch for models (GPT's attention): false makes them take reference_causal_attention. For
// comparisons and debugging; on unless the environment sets CROSSTRAIN_FUSED_ATTENTION=0.
void set_fused_attention(bool enabled);
bool fused_attention_enabled();

}  // namespace crosstrain::models
