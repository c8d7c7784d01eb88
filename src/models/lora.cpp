#include "crosstrain/models/lora.h"

namespace crosstrain::models {

torch::Tensor LoraAdapter::delta(const torch::Tensor& x, const parallel::TensorParallel& tp) const {
  auto low_rank = parallel::linear_with_store(x, A, torch::Tensor(), tp.weight_grads);
  return parallel::column_parallel_linear(low_rank, B, torch::Tensor(), tp) * scale;
}

LoraAdapter add_lora(torch::nn::Module& projection, const GPTConfig& c, int64_t in_features,
                     int64_t out_features_local) {
  LoraAdapter adapter;
  if (c.lora_rank <= 0) return adapter;
  adapter.A = projection.register_parameter("lora_A", torch::zeros({c.lora_rank, in_features}));
  adapter.B = projection.register_parameter("lora_B", torch::zeros({out_features_local, c.lora_rank}));
  adapter.scale = c.lora_scale();
  return adapter;
}

}  // namespace crosstrain::models
