#include "crosstrain/models/llama.h"

#include "crosstrain/models/fused_attention.h"
#include "crosstrain/models/mixed_precision.h"

namespace crosstrain::models {

namespace {
torch::nn::Linear unbiased(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}
}  // namespace

RotaryTables rotary_tables(int64_t block_size, int64_t head_dim, double theta) {
  // Frequency i of a head: theta^(-2i/hd) for i < hd/2; both halves of the head use the same frequencies.
  auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto inv_freq = torch::pow(theta, -torch::arange(0, head_dim, 2, f64) / static_cast<double>(head_dim));
  auto angles = torch::outer(torch::arange(block_size, f64), inv_freq);
  auto both = torch::cat({angles, angles}, -1);
  return {both.cos().to(torch::kFloat), both.sin().to(torch::kFloat)};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const RotaryTables& rope) {
  const int64_t T = x.size(2);
  auto cos = rope.cos.slice(0, 0, T).to(x.scalar_type()), sin = rope.sin.slice(0, 0, T).to(x.scalar_type());
  auto halves = x.chunk(2, -1);
  auto rotated = torch::cat({-halves[1], halves[0]}, -1);  // rotate_half
  return x * cos + rotated * sin;
}

RMSNormImpl::RMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto x32 = x.to(torch::kFloat);
  auto normed = (x32 * torch::rsqrt(x32.pow(2).mean(-1, true) + eps_)).to(x.scalar_type());
  return normed * weight;
}

LlamaAttentionImpl::LlamaAttentionImpl(const GPTConfig& c, const parallel::TensorParallel& tp, RotaryTables rope,
                                       torch::Tensor mask)
    : n_head_(c.n_head / tp.size),
      n_kv_head_(c.kv_heads() / tp.size),
      head_dim_(c.head_dim()),
      dropout_(c.dropout),
      tp_(tp),
      rope_(std::move(rope)),
      mask_(std::move(mask)) {
  q_proj = register_module("q_proj", unbiased(c.n_embd, n_head_ * head_dim_));
  k_proj = register_module("k_proj", unbiased(c.n_embd, n_kv_head_ * head_dim_));
  v_proj = register_module("v_proj", unbiased(c.n_embd, n_kv_head_ * head_dim_));
  o_proj = register_module("o_proj", unbiased(n_head_ * head_dim_, c.n_embd));
  q_lora = add_lora(*q_proj, c, c.n_embd, n_head_ * head_dim_);
  v_lora = add_lora(*v_proj, c, c.n_embd, n_kv_head_ * head_dim_);
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x) {
  // One entry into the region for the three projections (one gradient all-reduce or sequence gather).
  auto in = parallel::enter_column_region(x, tp_);
  auto project = [&](const torch::nn::Linear& l) {
    return parallel::linear_with_store(in, l->weight, torch::Tensor(), tp_.weight_grads);
  };
  auto q = project(q_proj), v = project(v_proj);
  if (q_lora.enabled()) q = q + q_lora.delta(x, tp_);
  if (v_lora.enabled()) v = v + v_lora.delta(x, tp_);
  auto qkv = torch::cat({q, project(k_proj), v}, -1);
  auto core = [this](const torch::Tensor& t) { return attention_core(t); };
  auto y = recompute_core ? recomputed(core, qkv, {}) : attention_core(qkv);
  auto out = parallel::row_parallel_linear(y, o_proj->weight, torch::Tensor(), tp_);
  return torch::dropout(out, dropout_, is_training());
}

torch::Tensor LlamaAttentionImpl::attention_core(const torch::Tensor& qkv) {
  const int64_t B = qkv.size(0), T = qkv.size(1), q_width = n_head_ * head_dim_, kv_width = n_kv_head_ * head_dim_;
  auto parts = qkv.split_with_sizes({q_width, kv_width, kv_width}, 2);
  // [B, T, heads * hd] -> [B, heads, T, hd]
  auto heads = [&](const torch::Tensor& t, int64_t n) { return t.view({B, T, n, head_dim_}).transpose(1, 2); };
  auto q = apply_rotary(heads(parts[0], n_head_), rope_);
  auto k = apply_rotary(heads(parts[1], n_kv_head_), rope_);
  auto v = heads(parts[2], n_kv_head_);
  if (n_kv_head_ != n_head_) {  // each key/value head serves a group of consecutive query heads
    k = k.repeat_interleave(n_head_ / n_kv_head_, 1);
    v = v.repeat_interleave(n_head_ / n_kv_head_, 1);
  }
  const bool dense = !fused_attention_enabled() || (dropout_ > 0 && is_training());
  auto att = dense ? reference_causal_attention(q.contiguous(), k.contiguous(), v.contiguous(), mask_, dropout_,
                                                is_training())
                   : causal_attention(q.contiguous(), k.contiguous(), v.contiguous());
  return att.transpose(1, 2).contiguous().view({B, T, q_width});
}

SwiGLUImpl::SwiGLUImpl(const GPTConfig& c, const parallel::TensorParallel& tp) : tp_(tp) {
  const int64_t f = c.mlp_hidden() / tp.size;
  gate_proj = register_module("gate_proj", unbiased(c.n_embd, f));
  up_proj = register_module("up_proj", unbiased(c.n_embd, f));
  down_proj = register_module("down_proj", unbiased(f, c.n_embd));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  auto in = parallel::enter_column_region(x, tp_);
  auto gate = parallel::linear_with_store(in, gate_proj->weight, torch::Tensor(), tp_.weight_grads);
  auto up = parallel::linear_with_store(in, up_proj->weight, torch::Tensor(), tp_.weight_grads);
  return parallel::row_parallel_linear(torch::silu(gate) * up, down_proj->weight, torch::Tensor(), tp_);
}

LlamaBlockImpl::LlamaBlockImpl(const GPTConfig& c, const parallel::TensorParallel& tp, RotaryTables rope,
                               torch::Tensor mask)
    : dropout_(c.dropout) {
  attn_norm = register_module("attn_norm", RMSNorm(c.n_embd, c.norm_eps));
  attn = register_module("attn", LlamaAttention(c, tp, std::move(rope), std::move(mask)));
  mlp_norm = register_module("mlp_norm", RMSNorm(c.n_embd, c.norm_eps));
  mlp = register_module("mlp", SwiGLU(c, tp));
}

torch::Tensor LlamaBlockImpl::residual_branches(torch::Tensor x) {
  x = x + attn(attn_norm(x));
  return x + torch::dropout(mlp(mlp_norm(x)), dropout_, is_training());
}

std::shared_ptr<DecoderBlockImpl> make_block(const GPTConfig& c, const parallel::TensorParallel& tp,
                                             const torch::Tensor& mask, const RotaryTables& rope) {
  if (c.is_llama()) return std::make_shared<LlamaBlockImpl>(c, tp, rope, mask);
  return std::make_shared<BlockImpl>(c, tp, mask);
}

std::shared_ptr<torch::nn::Module> make_final_norm(const GPTConfig& c) {
  if (c.is_llama()) return std::make_shared<RMSNormImpl>(c.n_embd, c.norm_eps);
  return std::make_shared<torch::nn::LayerNormImpl>(torch::nn::LayerNormOptions({c.n_embd}));
}

torch::Tensor apply_final_norm(const std::shared_ptr<torch::nn::Module>& norm, const torch::Tensor& x) {
  if (auto* rms = dynamic_cast<RMSNormImpl*>(norm.get())) return rms->forward(x);
  torch::nn::LayerNorm ln(std::dynamic_pointer_cast<torch::nn::LayerNormImpl>(norm));
  return layer_norm(ln, x);
}

}  // namespace crosstrain::models
