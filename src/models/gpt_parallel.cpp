#include "crosstrain/models/gpt_parallel.h"

#include <cmath>
#include <limits>

#include "crosstrain/core/error.h"
#include "crosstrain/parallel/tensor_parallel.h"

namespace crosstrain::models {
namespace tp = parallel::tp;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Parameters split over the tensor-parallel group; everything else is replicated.
bool is_sharded(const std::string& name) {
  return ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias") ||
         ends_with(name, "c_fc.weight") || ends_with(name, "c_fc.bias") || ends_with(name, "c_proj.weight") ||
         name == "wte.weight" || name == "lm_head.weight";
}

}  // namespace

torch::Tensor shard_of(const std::string& name, const torch::Tensor& full, const GPTConfig& c, int r, int n) {
  if (n == 1) return full;
  auto rows = [&](const torch::Tensor& t) { return t.chunk(n, 0)[r]; };
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    // [q; k; v] stacked: each of the three is split by heads.
    auto parts = full.chunk(3, 0);
    return torch::cat({rows(parts[0]), rows(parts[1]), rows(parts[2])}, 0);
  }
  if (ends_with(name, "c_fc.weight") || ends_with(name, "c_fc.bias") || name == "wte.weight" ||
      name == "lm_head.weight")
    return rows(full);
  if (ends_with(name, "c_proj.weight")) return full.chunk(n, 1)[r];  // row-parallel: split the input dim
  return full;                                                        // replicated
}

void check_parallel_plan(const GPTConfig& c, int tp, bool sequence_parallel, int virtual_stages) {
  if (tp < 1) throw UsageError("parallel.tp must be at least 1");
  if (c.n_head % tp != 0)
    throw UsageError("model.n_head = " + std::to_string(c.n_head) + " is not divisible by parallel.tp = " +
                     std::to_string(tp) + "; attention is split by heads");
  if (c.vocab_size % tp != 0)
    throw UsageError("model.vocab_size = " + std::to_string(c.vocab_size) + " is not divisible by parallel.tp = " +
                     std::to_string(tp) + "; pad the vocabulary to a multiple of tp");
  if (sequence_parallel && c.block_size % tp != 0)
    throw UsageError("model.block_size = " + std::to_string(c.block_size) +
                     " is not divisible by parallel.tp = " + std::to_string(tp) + " (needed by sequence parallelism)");
  if (virtual_stages > c.n_layer)
    throw UsageError("the pipeline has " + std::to_string(virtual_stages) + " stages (parallel.pp x chunks) but the model " +
                     "has only " + std::to_string(c.n_layer) + " layers (model.n_layer); use fewer stages");
}

std::vector<int64_t> partition_layers(int64_t layers, int stages, double embed_cost, double head_cost) {
  if (stages < 1 || stages > layers)
    throw UsageError("cannot split " + std::to_string(layers) + " layers into " + std::to_string(stages) + " stages");
  // Cost of stage [a, b): its blocks, plus the embedding or head when it is the first or last stage.
  auto cost = [&](int64_t a, int64_t b, int s) {
    return static_cast<double>(b - a) + (s == 0 ? embed_cost : 0) + (s == stages - 1 ? head_cost : 0);
  };
  // best[s][i]: the smallest possible maximum stage cost putting blocks [0, i) into stages 0..s-1.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(layers + 1, inf));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s)
    for (int64_t i = s; i <= layers; ++i)
      for (int64_t j = s - 1; j < i; ++j) {  // every stage gets at least one block
        double v = std::max(best[s - 1][j], cost(j, i, s - 1));
        if (v < best[s][i]) best[s][i] = v, cut[s][i] = j;
      }
  std::vector<int64_t> bounds(stages + 1);
  bounds[stages] = layers;
  for (int s = stages; s > 0; --s) bounds[s - 1] = cut[s][bounds[s]];
  return bounds;
}

std::vector<int64_t> partition_gpt(const GPTConfig& c, int stages) {
  const double block = 12.0 * c.n_embd * c.n_embd;
  // The embedding is a lookup (cheap); the head is a d x V matmul plus the loss.
  return partition_layers(c.n_layer, stages, 0.1, static_cast<double>(c.n_embd * c.vocab_size) / block);
}

namespace {
// A block's parameters in forward order.
constexpr const char* kBlockLeaves[] = {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                                        "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                                        "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"};
}  // namespace

GPTStageImpl::GPTStageImpl(const GPTConfig& config, StageSpec spec, TensorParallelContext tp, GPT& full)
    : config_(config), spec_(spec), tp_(tp) {
  causal_mask_ = torch::ones({config.block_size, config.block_size}, torch::kBool).triu(1);
  auto reference = full->named_parameters();
  auto take = [&](const std::string& name) {
    torch::Tensor shard = shard_of(name, reference[name].detach(), config_, tp_.rank, tp_.size).clone();
    // Names keep their dots; register under a flat key and remember the plain name.
    std::string key = name;
    std::replace(key.begin(), key.end(), '.', '_');
    params_[name] = register_parameter(key, shard);
  };
  if (spec_.has_embedding) {
    take("wte.weight");
    take("wpe.weight");
  }
  for (int64_t i = spec_.first_layer; i < spec_.last_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    for (const char* leaf : kBlockLeaves) take(h + leaf);
  }
  if (spec_.has_head) {
    take("ln_f.weight");
    take("ln_f.bias");
    take("lm_head.weight");
  }
}

torch::Tensor& GPTStageImpl::p(const std::string& name) { return params_.at(name); }

torch::Tensor GPTStageImpl::attention(int64_t layer, const torch::Tensor& x) {
  const std::string h = "h." + std::to_string(layer) + ".";
  const int64_t d = config_.n_embd, heads = config_.n_head / tp_.size, hd = d / config_.n_head;
  auto qkv = parallel::column_parallel_linear(torch::layer_norm(x, {d}, p(h + "ln_1.weight"), p(h + "ln_1.bias")),
                                              p(h + "attn.c_attn.weight"), p(h + "attn.c_attn.bias"), tp_);
  const int64_t B = qkv.size(0), T = qkv.size(1), local = heads * hd;
  auto qkv_parts = qkv.split(local, 2);
  auto split_heads = [&](const torch::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
  auto q = split_heads(qkv_parts[0]) * (1.0 / std::sqrt(static_cast<double>(hd))), k = split_heads(qkv_parts[1]),
       v = split_heads(qkv_parts[2]);
  auto att = torch::matmul(q, k.transpose(-2, -1));
  auto mask = causal_mask_.slice(0, 0, T).slice(1, 0, T);
  att = torch::softmax(att.masked_fill(mask, -std::numeric_limits<float>::infinity()), -1);
  att = torch::dropout(att, config_.dropout, is_training());
  auto y = torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, local});
  auto out = parallel::row_parallel_linear(y, p(h + "attn.c_proj.weight"), p(h + "attn.c_proj.bias"), tp_);
  return torch::dropout(out, config_.dropout, is_training());
}

torch::Tensor GPTStageImpl::mlp(int64_t layer, const torch::Tensor& x) {
  const std::string h = "h." + std::to_string(layer) + ".";
  auto in = torch::layer_norm(x, {config_.n_embd}, p(h + "ln_2.weight"), p(h + "ln_2.bias"));
  auto hidden = torch::gelu(parallel::column_parallel_linear(in, p(h + "mlp.c_fc.weight"), p(h + "mlp.c_fc.bias"), tp_));
  auto out = parallel::row_parallel_linear(hidden, p(h + "mlp.c_proj.weight"), p(h + "mlp.c_proj.bias"), tp_);
  return torch::dropout(out, config_.dropout, is_training());
}

torch::Tensor GPTStageImpl::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  int unit = 0;
  if (spec_.has_embedding) {
    if (hooks_) hooks_->before_unit(unit);
    const int64_t T = input.size(1);
    auto emb = parallel::vocab_parallel_embedding(input, p("wte.weight"), tp_);
    auto pos = p("wpe.weight").slice(0, 0, T);
    if (tp_.sequence_parallel) pos = pos.chunk(tp_.size, 0)[tp_.rank];
    x = torch::dropout(emb + pos, config_.dropout, is_training());
    if (hooks_) x = hooks_->after_unit(unit, x);
    ++unit;
  }
  for (int64_t i = spec_.first_layer; i < spec_.last_layer; ++i, ++unit) {
    if (hooks_) hooks_->before_unit(unit);
    x = x + attention(i, x);
    x = x + mlp(i, x);
    if (hooks_) x = hooks_->after_unit(unit, x);
  }
  return x;
}

torch::Tensor GPTStageImpl::loss(const torch::Tensor& input, const torch::Tensor& targets) {
  return head(forward(input), targets);
}

torch::Tensor GPTStageImpl::head(const torch::Tensor& hidden, const torch::Tensor& targets) {
  const int unit = static_cast<int>(unit_names().size()) - 1;
  if (hooks_) hooks_->before_unit(unit);
  auto x = torch::layer_norm(hidden, {config_.n_embd}, p("ln_f.weight"), p("ln_f.bias"));
  auto logits = parallel::column_parallel_linear(x, p("lm_head.weight"), torch::Tensor(), tp_);
  auto loss = tp::vocab_parallel_cross_entropy(logits, targets, tp_.rank * (config_.vocab_size / tp_.size), tp_.group);
  return hooks_ ? hooks_->after_unit(unit, loss) : loss;
}

std::vector<std::vector<std::string>> GPTStageImpl::unit_names() const {
  std::vector<std::vector<std::string>> units;
  if (spec_.has_embedding) units.push_back({"wte.weight", "wpe.weight"});
  for (int64_t i = spec_.first_layer; i < spec_.last_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    units.emplace_back();
    for (const char* leaf : kBlockLeaves) units.back().push_back(h + leaf);
  }
  if (spec_.has_head) units.push_back({"ln_f.weight", "ln_f.bias", "lm_head.weight"});
  return units;
}

torch::Tensor GPTStageImpl::pipeline_forward(const torch::Tensor& activation, const torch::Tensor& tokens,
                                             const torch::Tensor& targets, double loss_scale) {
  const torch::Tensor& in = spec_.has_embedding ? tokens : activation;
  return spec_.has_head ? loss(in, targets) * loss_scale : forward(in);
}

bool GPTStageImpl::is_replicated(const std::string& name) const { return tp_.size > 1 && !is_sharded(name); }

std::vector<torch::Tensor> GPTStageImpl::partial_gradient_parameters() {
  std::vector<torch::Tensor> out;
  if (!tp_.sequence_parallel || tp_.size == 1) return out;
  for (const auto& [name, t] : params_)
    if (is_replicated(name)) out.push_back(t);
  return out;
}

}  // namespace crosstrain::models
