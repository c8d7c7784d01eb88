// A decoder-only GPT (GPT-2 layout, nanoGPT parameter names), written for one device.
//
//   tokens -> wte + wpe -> dropout -> n_layer x [x + attn(ln_1(x)); x + mlp(ln_2(x))] -> ln_f -> lm_head -> logits
//
// Parallelism is applied from outside; this module knows nothing of ranks. Parameter names are stable
// ("h.3.attn.c_attn.weight") and are what checkpoints and parallel plans refer to.
#pragma once

#include <torch/torch.h>

#include "crosstrain/models/gpt_config.h"

#include <cstdint>
#include <string>

namespace crosstrain::models {


class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};

 private:
  int64_t n_head_;
  torch::Tensor mask_;  // [T, T] upper triangle true: positions a token must not see
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& config);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLP);

class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const GPTConfig& config);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};
};
TORCH_MODULE(Block);

class GPTImpl : public torch::nn::Module {
 public:
  // Initializes every parameter from `seed` alone (GPT-2 scheme: N(0, 0.02), residual projections
  // N(0, 0.02/sqrt(2 n_layer)), zero biases, unit LayerNorm), so every rank and layout builds the same model.
  GPTImpl(const GPTConfig& config, uint64_t seed);

  // tokens [B, T] (int64) -> logits [B, T, vocab]
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross-entropy of next-token prediction.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);
  // Appends `new_tokens` sampled tokens (temperature, top-k) to `prompt` [1, t]; no gradients.
  torch::Tensor generate(torch::Tensor prompt, int64_t new_tokens, double temperature, int64_t top_k,
                         uint64_t seed);

  const GPTConfig& config() const { return config_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};

 private:
  void initialize(uint64_t seed);
  GPTConfig config_;
};
TORCH_MODULE(GPT);

}  // namespace crosstrain::models
