#include "crosstrain/models/gpt.h"

#include <cmath>
#include <limits>

#include "crosstrain/core/error.h"
#include "crosstrain/models/fused_attention.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/models/llama.h"
#include "crosstrain/models/mixed_precision.h"

namespace crosstrain::models {

namespace {
// at::linear, not the module's forward: libtorch's C++ Linear multiplies and then adds the bias in a second
// pass for 3-D inputs, while at::linear folds the batch into one fused addmm (about 10% of a step here).
// Column-parallel: the input enters the region (gathered along the sequence under sequence parallelism).
torch::Tensor column_linear(const torch::Tensor& x, const torch::nn::Linear& layer, const parallel::TensorParallel& tp) {
  return parallel::column_parallel_linear(x, layer->weight, layer->bias, tp);
}
// Row-parallel: the partial products are reduced and the bias is added once, after the reduction. On one
// device the bias stays in the fused addmm.
torch::Tensor row_linear(const torch::Tensor& x, const torch::nn::Linear& layer, const parallel::TensorParallel& tp) {
  return parallel::row_parallel_linear(x, layer->weight, layer->bias, tp);
}
}  // namespace

torch::Tensor causal_mask(int64_t block_size) {
  return torch::ones({block_size, block_size}, torch::kBool).triu(1);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& c, const parallel::TensorParallel& tp,
                                                 torch::Tensor mask)
    : n_head_(c.n_head / tp.size), tp_(tp) {
  c_attn = register_module("c_attn", torch::nn::Linear(c.n_embd, 3 * c.n_embd / tp.size));
  c_proj = register_module("c_proj", torch::nn::Linear(c.n_embd / tp.size, c.n_embd));
  c_attn_lora = add_lora(*c_attn, c, c.n_embd, 3 * c.n_embd / tp.size);
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(c.dropout));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(c.dropout));
  mask_ = register_buffer("mask", mask.defined() ? mask : causal_mask(c.block_size));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  // This rank's heads of q, k and v, over the whole sequence.
  auto qkv = column_linear(x, c_attn, tp_);
  if (c_attn_lora.enabled()) qkv = qkv + c_attn_lora.delta(x, tp_);
  auto core = [this](const torch::Tensor& t) { return attention_core(t); };
  auto y = recompute_core ? recomputed(core, qkv, {}) : attention_core(qkv);
  return resid_dropout(row_linear(y, c_proj, tp_));
}

torch::Tensor CausalSelfAttentionImpl::attention_core(const torch::Tensor& qkv) {
  const auto B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3;  // C: this rank's width, n_head_ * hd
  const auto hd = C / n_head_;
  auto parts = qkv.split(C, 2);
  // [B, T, C] -> [B, H, T, hd]
  auto heads = [&](const torch::Tensor& t) { return t.view({B, T, n_head_, hd}).transpose(1, 2); };
  // Unscaled: both attentions scale by 1/sqrt(hd) themselves.
  auto q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  // The fused kernel (fused_attention.h) has no dropout: attention dropout in training takes the dense path.
  const double p = attn_dropout->options.p();
  const bool dense = !fused_attention_enabled() || (p > 0 && attn_dropout->is_training());
  auto att = dense ? reference_causal_attention(q, k, v, mask_, p, attn_dropout->is_training())
                   : causal_attention(q, k, v);
  return att.transpose(1, 2).contiguous().view({B, T, C});
}

MLPImpl::MLPImpl(const GPTConfig& c, const parallel::TensorParallel& tp) : tp_(tp) {
  c_fc = register_module("c_fc", torch::nn::Linear(c.n_embd, 4 * c.n_embd / tp.size));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * c.n_embd / tp.size, c.n_embd));
  dropout = register_module("dropout", torch::nn::Dropout(c.dropout));
}

torch::Tensor MLPImpl::forward(const torch::Tensor& x) {
  return dropout(row_linear(torch::gelu(column_linear(x, c_fc, tp_)), c_proj, tp_));
}

BlockImpl::BlockImpl(const GPTConfig& c, const parallel::TensorParallel& tp, torch::Tensor mask) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  attn = register_module("attn", CausalSelfAttention(c, tp, std::move(mask)));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.n_embd})));
  mlp = register_module("mlp", MLP(c, tp));
}

void DecoderBlockImpl::set_recompute(Recompute r) {
  recompute_ = r;
  set_recompute_core(r == Recompute::Selective);
}

torch::Tensor DecoderBlockImpl::forward(torch::Tensor x) {
  if (recompute_ != Recompute::Full) return residual_branches(x);
  return recomputed([this](const torch::Tensor& t) { return residual_branches(t); }, x, parameters());
}

torch::Tensor BlockImpl::residual_branches(torch::Tensor x) {
  x = x + attn(layer_norm(ln_1, x));
  return x + mlp(layer_norm(ln_2, x));
}

GPTImpl::GPTImpl(const GPTConfig& c, uint64_t seed) : config_(c) {
  c.validate();
  wte = register_module("wte", torch::nn::Embedding(c.vocab_size, c.n_embd));
  if (!c.is_llama()) wpe = register_module("wpe", torch::nn::Embedding(c.block_size, c.n_embd));
  drop = register_module("drop", torch::nn::Dropout(c.dropout));
  h = register_module("h", torch::nn::ModuleList());
  const torch::Tensor mask = causal_mask(c.block_size);
  const RotaryTables rope = c.is_llama() ? rotary_tables(c.block_size, c.head_dim(), c.rope_theta) : RotaryTables{};
  for (int64_t i = 0; i < c.n_layer; ++i) h->push_back(make_block(c, parallel::TensorParallel{}, mask, rope));
  ln_f = register_module("ln_f", make_final_norm(c));
  if (!(c.is_llama() && c.tie_embeddings))
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.n_embd, c.vocab_size).bias(false)));
  initialize(seed);
}

void GPTImpl::initialize(uint64_t seed) {
  // Each parameter from its own generator, by name and shape (gpt_init.h): a pipeline stage or a tensor-parallel
  // rank draws exactly these values for the parameters it holds without building this model.
  const ParallelPlan plan(config_);
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) fill_initial(item.value(), plan.at(item.key()), seed);
}

torch::Tensor GPTImpl::forward(const torch::Tensor& tokens) {
  const auto T = tokens.size(1);
  TORCH_CHECK(T <= config_.block_size, "sequence of ", T, " tokens is longer than block_size ", config_.block_size);
  auto x = wte(tokens);
  if (wpe) x = x + wpe(torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device())));
  x = drop(x);
  for (const auto& block : *h) x = block->as<DecoderBlockImpl>()->forward(x);
  return torch::linear(apply_final_norm(ln_f, x), head_weight());
}

torch::Tensor GPTImpl::loss(const torch::Tensor& tokens, const torch::Tensor& targets) {
  auto logits = forward(tokens);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

torch::Tensor GPTImpl::generate(torch::Tensor tokens, int64_t new_tokens, double temperature, int64_t top_k,
                                uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(seed);
  const bool was_training = is_training();
  eval();
  for (int64_t i = 0; i < new_tokens; ++i) {
    auto context = tokens.size(1) <= config_.block_size ? tokens : tokens.slice(1, tokens.size(1) - config_.block_size);
    auto logits = forward(context).select(1, context.size(1) - 1) / std::max(temperature, 1e-6);
    if (top_k > 0 && top_k < logits.size(-1)) {
      auto kth = std::get<0>(logits.topk(top_k)).select(-1, top_k - 1).unsqueeze(-1);
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto next = torch::multinomial(torch::softmax(logits, -1), 1, false, gen);
    tokens = torch::cat({tokens, next}, 1);
  }
  train(was_training);
  return tokens;
}

}  // namespace crosstrain::models
