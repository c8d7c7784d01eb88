// A decoder-only GPT (GPT-2 layout, nanoGPT parameter names), written for one device.
//
//   tokens -> wte + wpe -> dropout -> n_layer x [x + attn(ln_1(x)); x + mlp(ln_2(x))] -> ln_f -> lm_head -> logits
//
// Parameter names are stable ("h.3.attn.c_attn.weight") and are what checkpoints and the parallel plan
// (parallel_plan.h) refer to. The blocks are also the tensor-parallel ones: built with a TensorParallel context
// they hold one rank's shard (n_head/tp heads, 4 n_embd/tp hidden) and wrap their column- and row-parallel
// linears in the conjugate mappings (tp_layers.h), so attention and the MLP are defined once. The GPT itself
// is the single-device model; pipeline stages of it are in gpt_parallel.h.
#pragma once

#include <torch/torch.h>

#include "crosstrain/models/gpt_config.h"
#include "crosstrain/models/lora.h"
#include "crosstrain/models/recompute.h"
#include "crosstrain/parallel/tp_layers.h"

#include <cstdint>
#include <string>

namespace crosstrain::models {

// [block_size, block_size], true above the diagonal: the positions a token must not see. Built once per model
// and shared by its attention layers.
torch::Tensor causal_mask(int64_t block_size);

// `tp` (default: one device) gives the shard a block holds; `mask` a shared causal_mask (undefined: its own).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const GPTConfig& config, const parallel::TensorParallel& tp = {},
                                   torch::Tensor mask = {});
  // x [B, T, C] (or [B, T/tp, C] with sequence parallelism) -> the same shape.
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};  // column-parallel by heads, row-parallel
  LoraAdapter c_attn_lora;                              // with model.lora_rank > 0
  torch::nn::Dropout attn_dropout{nullptr}, resid_dropout{nullptr};
  bool recompute_core = false;  // selective recomputation: q, k, v -> attention output redone in backward

 private:
  // q, k, v [B, T, 3C] -> the heads' attention output [B, T, C] (before the output projection).
  torch::Tensor attention_core(const torch::Tensor& qkv);
  int64_t n_head_;  // heads on this rank
  parallel::TensorParallel tp_;
  torch::Tensor mask_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  explicit MLPImpl(const GPTConfig& config, const parallel::TensorParallel& tp = {});
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};  // column-parallel, row-parallel
  torch::nn::Dropout dropout{nullptr};

 private:
  parallel::TensorParallel tp_;
};
TORCH_MODULE(MLP);

// A block of either family (this GPT-2 block, llama.h's): its two residual branches, and recomputation.
class DecoderBlockImpl : public torch::nn::Module {
 public:
  // x [B, T, d] (or [B, T/tp, d] with sequence parallelism) -> the same shape.
  torch::Tensor forward(torch::Tensor x);
  // train.recompute: full redoes the whole block in backward, selective its attention core.
  void set_recompute(Recompute r);

 protected:
  virtual torch::Tensor residual_branches(torch::Tensor x) = 0;
  virtual void set_recompute_core(bool on) = 0;

 private:
  Recompute recompute_ = Recompute::None;
};

class BlockImpl : public DecoderBlockImpl {
 public:
  explicit BlockImpl(const GPTConfig& config, const parallel::TensorParallel& tp = {}, torch::Tensor mask = {});

  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  CausalSelfAttention attn{nullptr};
  MLP mlp{nullptr};

 protected:
  torch::Tensor residual_branches(torch::Tensor x) override;
  void set_recompute_core(bool on) override { attn->recompute_core = on; }
};
TORCH_MODULE(Block);

// The single-device model of either family (config.arch): for llama, h holds llama.h's blocks, there is no
// wpe, ln_f is an RMSNorm and, with tie_embeddings, no lm_head (the head multiplies by wte).
class GPTImpl : public torch::nn::Module {
 public:
  // Initializes every parameter from `seed` alone (GPT-2 scheme: N(0, 0.02), residual projections
  // N(0, 0.02/sqrt(2 n_layer)), zero biases, unit LayerNorm), each parameter from its own generator seeded by
  // its name (gpt_init.h), so every rank and layout draws the same values for the parameters it holds.
  GPTImpl(const GPTConfig& config, uint64_t seed);

  // tokens [B, T] (int64) -> logits [B, T, vocab]
  torch::Tensor forward(const torch::Tensor& tokens);
  // Mean cross-entropy of next-token prediction.
  torch::Tensor loss(const torch::Tensor& tokens, const torch::Tensor& targets);
  // Appends `new_tokens` sampled tokens (temperature, top-k) to `prompt` [1, t]; no gradients.
  torch::Tensor generate(torch::Tensor prompt, int64_t new_tokens, double temperature, int64_t top_k,
                         uint64_t seed);

  const GPTConfig& config() const { return config_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};  // wpe: gpt only
  torch::nn::Dropout drop{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::shared_ptr<torch::nn::Module> ln_f;  // LayerNorm (gpt) or RMSNorm (llama)
  torch::nn::Linear lm_head{nullptr};       // null when the head is tied to wte
  // The head's weight: lm_head's, or wte's when tied.
  const torch::Tensor& head_weight() const { return lm_head ? lm_head->weight : wte->weight; }

 private:
  void initialize(uint64_t seed);
  GPTConfig config_;
};
TORCH_MODULE(GPT);

}  // namespace crosstrain::models
