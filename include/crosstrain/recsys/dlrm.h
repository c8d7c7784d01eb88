// The dense part of DLRM (Naumov et al., 2019): a bottom MLP over the dense features, the pairwise dot-product
// interaction of its output with every pooled embedding, and a top MLP to one logit. The embedding tables live
// apart (sharded_embedding.h or the parameter server); this module is the same on every rank (data parallel).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>

#include <string>
#include <vector>

#include "crosstrain/recsys/dlrm_config.h"

namespace crosstrain::recsys {

class DlrmDenseImpl : public torch::nn::Module {
 public:
  // Initialised from `seed` alone (nn.Linear's uniform bounds, 1/sqrt(fan_in)), with a generator of its own: the
  // same on every rank, in one process, and when ranks are threads of one process.
  DlrmDenseImpl(const DlrmConfig& config, uint64_t seed);
  // dense [B, dense_features], pooled: one [B, dim] per table -> logits [B].
  torch::Tensor forward(const torch::Tensor& dense, const std::vector<torch::Tensor>& pooled);
  // Parameters with their names ("bottom.0.weight", ...), in a fixed order.
  std::vector<std::pair<std::string, torch::Tensor>> named() const;

 private:
  torch::nn::Sequential bottom_{nullptr}, top_{nullptr};
};
TORCH_MODULE(DlrmDense);

// The interaction alone: x [B, d] and pooled [B, d] each -> [B, d + F (F - 1) / 2] (F = 1 + tables), x then the
// dot products of every pair of distinct features.
torch::Tensor dot_interaction(const torch::Tensor& x, const std::vector<torch::Tensor>& pooled);

}  // namespace crosstrain::recsys
