// Mixed precision inside the model (train.precision = "bf16", docs/speed.md "bf16 everywhere"): the parameters
// and activations are bf16, but a LayerNorm's mean and variance are taken in fp32, as torch.autocast does.
#pragma once

#include <torch/nn/modules/normalization.h>

namespace crosstrain::models {

// ln(x), computed in fp32 when x is bf16 (or fp16) and returned in x's dtype. Over a row of a few hundred
// values bf16 statistics lose digits, and libtorch's bf16 CPU LayerNorm is also ~10x slower than its fp32 one
// (measured: 1.2 ms against 0.1 ms for 1024 x 128).
inline torch::Tensor layer_norm(torch::nn::LayerNorm& ln, const torch::Tensor& x) {
  if (x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble) return ln(x);
  const auto& o = ln->options;
  return at::layer_norm(x.to(at::kFloat), o.normalized_shape(), ln->weight.to(at::kFloat), ln->bias.to(at::kFloat),
                        o.eps())
      .to(x.scalar_type());
}

}  // namespace crosstrain::models
