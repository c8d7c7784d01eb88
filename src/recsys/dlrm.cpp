#include "crosstrain/recsys/dlrm.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>

namespace crosstrain::recsys {
namespace {

// Linear + ReLU per width; the last layer of the top MLP (the logit) has no ReLU.
torch::nn::Sequential mlp(int64_t in, const std::vector<int64_t>& widths, bool relu_last) {
  torch::nn::Sequential seq;
  for (size_t i = 0; i < widths.size(); ++i) {
    seq->push_back(torch::nn::Linear(in, widths[i]));
    if (i + 1 < widths.size() || relu_last) seq->push_back(torch::nn::ReLU());
    in = widths[i];
  }
  return seq;
}

}  // namespace

DlrmDenseImpl::DlrmDenseImpl(const DlrmConfig& config, uint64_t seed) {
  const int64_t features = static_cast<int64_t>(config.table_rows().size()) + 1;
  bottom_ = register_module("bottom", mlp(config.dense_features, config.bottom_widths(), true));
  top_ = register_module("top", mlp(config.embedding_dim + features * (features - 1) / 2, config.top_widths(), false));
  at::Generator gen = at::detail::createCPUGenerator(seed);
  torch::NoGradGuard no_grad;
  for (auto* seq : {&bottom_, &top_})
    for (const auto& m : (*seq)->children())
      if (auto* linear = m->as<torch::nn::Linear>()) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(linear->weight.size(1)));
        linear->weight.uniform_(-bound, bound, gen);
        linear->bias.uniform_(-bound, bound, gen);
      }
}

torch::Tensor dot_interaction(const torch::Tensor& x, const std::vector<torch::Tensor>& pooled) {
  std::vector<torch::Tensor> all{x};
  all.insert(all.end(), pooled.begin(), pooled.end());
  const torch::Tensor t = torch::stack(all, 1);                 // [B, F, d]
  const torch::Tensor z = torch::bmm(t, t.transpose(1, 2));     // [B, F, F]
  const int64_t f = t.size(1);
  const torch::Tensor pairs = torch::tril_indices(f, f, -1);    // below the diagonal: each pair once
  return torch::cat({x, z.index({torch::indexing::Slice(), pairs[0], pairs[1]})}, 1);
}

torch::Tensor DlrmDenseImpl::forward(const torch::Tensor& dense, const std::vector<torch::Tensor>& pooled) {
  const torch::Tensor x = bottom_->forward(dense);
  return top_->forward(dot_interaction(x, pooled)).squeeze(1);
}

std::vector<std::pair<std::string, torch::Tensor>> DlrmDenseImpl::named() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& item : named_parameters(true)) out.emplace_back(item.key(), item.value());
  return out;
}

}  // namespace crosstrain::recsys
