// The Llama family's block (Touvron et al. 2023; model.arch = "llama"), written once for one device and for a
// tensor-parallel rank, like the GPT's block (gpt.h):
//
//   x + o_proj(attention(rope(q_proj(n)), rope(k_proj(n)), v_proj(n)))   n = attn_norm(x)   (RMSNorm)
//   x + down_proj(silu(gate_proj(n)) * up_proj(n))                       n = mlp_norm(x)
//
// Rotary position embeddings use Hugging Face's "rotate half" layout (the first and second halves of a head
// form the pairs), so weights go to and from transformers' LlamaForCausalLM without permuting q and k.
// Grouped-query attention: n_kv_head key/value heads, each serving n_head / n_kv_head consecutive query heads.
// Under tensor parallelism a rank holds n_head / tp query heads and the n_kv_head / tp key/value heads they
// use, and F / tp of the SwiGLU width; no linear has a bias.
#pragma once

#include <torch/torch.h>

#include "crosstrain/models/gpt.h"

namespace crosstrain::models {

// cos and sin of every (position, rotary frequency), [block_size, head_dim] each, fp32; built once per model
// and shared by its attention layers.
struct RotaryTables {
  torch::Tensor cos, sin;
};
RotaryTables rotary_tables(int64_t block_size, int64_t head_dim, double theta);
// x [B, H, T, hd] rotated by position (T <= the tables' length): x cos + rotate_half(x) sin.
torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryTables& rope);

// y = x / rms(x) * weight, the statistics in fp32 for bf16 inputs (as transformers' LlamaRMSNorm).
class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const GPTConfig& config, const parallel::TensorParallel& tp, RotaryTables rope,
                     torch::Tensor mask);
  torch::Tensor forward(const torch::Tensor& x);

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LoraAdapter q_lora, v_lora;  // with model.lora_rank > 0
  bool recompute_core = false;  // selective recomputation of q, k, v -> attention output

 private:
  // [q | k | v] along the features -> this rank's heads' attention output [B, T, n_head/tp * hd].
  torch::Tensor attention_core(const torch::Tensor& qkv);
  int64_t n_head_, n_kv_head_, head_dim_;
  double dropout_;
  parallel::TensorParallel tp_;
  RotaryTables rope_;
  torch::Tensor mask_;
};
TORCH_MODULE(LlamaAttention);

class SwiGLUImpl : public torch::nn::Module {
 public:
  SwiGLUImpl(const GPTConfig& config, const parallel::TensorParallel& tp);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  parallel::TensorParallel tp_;
};
TORCH_MODULE(SwiGLU);

class LlamaBlockImpl : public DecoderBlockImpl {
 public:
  LlamaBlockImpl(const GPTConfig& config, const parallel::TensorParallel& tp, RotaryTables rope, torch::Tensor mask);

  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  LlamaAttention attn{nullptr};
  SwiGLU mlp{nullptr};

 protected:
  torch::Tensor residual_branches(torch::Tensor x) override;
  void set_recompute_core(bool on) override { attn->recompute_core = on; }

 private:
  double dropout_;
};
TORCH_MODULE(LlamaBlock);

// A block of config.arch's family, at the shard size of `tp`. `rope` is only read by llama.
std::shared_ptr<DecoderBlockImpl> make_block(const GPTConfig& config, const parallel::TensorParallel& tp,
                                             const torch::Tensor& mask, const RotaryTables& rope);
// The final norm of config.arch's family (LayerNorm for gpt, RMSNorm for llama), and its application.
std::shared_ptr<torch::nn::Module> make_final_norm(const GPTConfig& config);
torch::Tensor apply_final_norm(const std::shared_ptr<torch::nn::Module>& norm, const torch::Tensor& x);

}  // namespace crosstrain::models
