#include "crosstrain/models/parallel_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "crosstrain/core/error.h"

namespace crosstrain::models {

const char* to_string(Split split) {
  switch (split) {
    case Split::Replicated: return "replicated";
    case Split::Column: return "column";
    case Split::Row: return "row";
    case Split::Vocabulary: return "vocabulary";
  }
  return "?";
}

// The table itself: the only place that says how each parameter of either family is split and initialised.
ParallelPlan::ParallelPlan(const GPTConfig& c) : config_(c) {
  if (c.is_llama()) add_llama();
  else add_gpt();
}

void ParallelPlan::add_gpt() {
  const GPTConfig& c = config_;
  const int64_t d = c.n_embd;
  const double w = 0.02, residual = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  constexpr Init N = Init::Normal, ONE = Init::Ones, ZERO = Init::Zeros;
  add("wte.weight", {c.vocab_size, d}, Split::Vocabulary, N, w, Part::Embedding, -1);
  add("wpe.weight", {c.block_size, d}, Split::Replicated, N, w, Part::Embedding, -1);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "ln_1.weight", {d}, Split::Replicated, ONE, 0, Part::Block, i);
    add(h + "ln_1.bias", {d}, Split::Replicated, ZERO, 0, Part::Block, i);
    add(h + "attn.c_attn.weight", {3 * d, d}, Split::Column, N, w, Part::Block, i, 3);
    add(h + "attn.c_attn.bias", {3 * d}, Split::Column, ZERO, 0, Part::Block, i, 3);
    add_lora(h + "attn.c_attn", d, 3 * d, i, 3);
    add(h + "attn.c_proj.weight", {d, d}, Split::Row, N, residual, Part::Block, i);
    add(h + "attn.c_proj.bias", {d}, Split::Replicated, ZERO, 0, Part::Block, i);  // added once, after the reduction
    add(h + "ln_2.weight", {d}, Split::Replicated, ONE, 0, Part::Block, i);
    add(h + "ln_2.bias", {d}, Split::Replicated, ZERO, 0, Part::Block, i);
    add(h + "mlp.c_fc.weight", {4 * d, d}, Split::Column, N, w, Part::Block, i);
    add(h + "mlp.c_fc.bias", {4 * d}, Split::Column, ZERO, 0, Part::Block, i);
    add(h + "mlp.c_proj.weight", {d, 4 * d}, Split::Row, N, residual, Part::Block, i);
    add(h + "mlp.c_proj.bias", {d}, Split::Replicated, ZERO, 0, Part::Block, i);
  }
  add("ln_f.weight", {d}, Split::Replicated, ONE, 0, Part::Head, -1);
  add("ln_f.bias", {d}, Split::Replicated, ZERO, 0, Part::Head, -1);
  add("lm_head.weight", {c.vocab_size, d}, Split::Column, N, w, Part::Head, -1);  // columns = the vocabulary
}

// Llama: q, k and v split by heads (k and v by key/value heads, so a rank keeps the ones its query heads use),
// gate and up column-parallel, o and down row-parallel; RMSNorm gains replicated. No biases, no positions.
void ParallelPlan::add_llama() {
  const GPTConfig& c = config_;
  const int64_t d = c.n_embd, q = c.n_head * c.head_dim(), kv = c.kv_heads() * c.head_dim(), f = c.mlp_hidden();
  const double w = 0.02, residual = 0.02 / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  constexpr Init N = Init::Normal, ONE = Init::Ones;
  add("wte.weight", {c.vocab_size, d}, Split::Vocabulary, N, w, Part::Embedding, -1);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    add(h + "attn_norm.weight", {d}, Split::Replicated, ONE, 0, Part::Block, i);
    add(h + "attn.q_proj.weight", {q, d}, Split::Column, N, w, Part::Block, i);
    add_lora(h + "attn.q_proj", d, q, i, 1);
    add(h + "attn.k_proj.weight", {kv, d}, Split::Column, N, w, Part::Block, i);
    add(h + "attn.v_proj.weight", {kv, d}, Split::Column, N, w, Part::Block, i);
    add_lora(h + "attn.v_proj", d, kv, i, 1);
    add(h + "attn.o_proj.weight", {d, q}, Split::Row, N, residual, Part::Block, i);
    add(h + "mlp_norm.weight", {d}, Split::Replicated, ONE, 0, Part::Block, i);
    add(h + "mlp.gate_proj.weight", {f, d}, Split::Column, N, w, Part::Block, i);
    add(h + "mlp.up_proj.weight", {f, d}, Split::Column, N, w, Part::Block, i);
    add(h + "mlp.down_proj.weight", {d, f}, Split::Row, N, residual, Part::Block, i);
  }
  add("ln_f.weight", {d}, Split::Replicated, ONE, 0, Part::Head, -1);
  if (!c.tie_embeddings) add("lm_head.weight", {c.vocab_size, d}, Split::Column, N, w, Part::Head, -1);
}

// LoRA (lora.h): A replicated, drawn like PEFT's default scale (N(0, 1/in)); B split as its projection, zero.
void ParallelPlan::add_lora(const std::string& projection, int64_t in, int64_t out, int64_t layer, int64_t fused) {
  if (config_.lora_rank <= 0) return;
  const int64_t r = config_.lora_rank;
  add(projection + ".lora_A", {r, in}, Split::Replicated, Init::Normal, 1.0 / std::sqrt(static_cast<double>(in)),
      Part::Block, layer);
  add(projection + ".lora_B", {out, r}, Split::Column, Init::Zeros, 0, Part::Block, layer, fused);
}

void ParallelPlan::add(std::string name, std::vector<int64_t> shape, Split split, Init init, double init_std,
                       Part part, int64_t layer, int64_t fused) {
  ParameterPlan p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.split = split;
  p.fused = fused;
  p.init = init;
  p.init_std = init_std;
  // Under sequence parallelism every replicated parameter (LayerNorms, row-parallel biases, wpe) sees only
  // this rank's tokens; the split ones see every token through the gathers of their regions.
  p.partial_under_sp = split == Split::Replicated;
  p.part = part;
  p.layer = layer;
  p.unit = part == Part::Embedding ? 0 : part == Part::Block ? 1 + layer : config_.n_layer + 1;
  index_[p.name] = params_.size();
  params_.push_back(std::move(p));
}

const ParameterPlan& ParallelPlan::at(const std::string& name) const {
  auto it = index_.find(name);
  if (it == index_.end())
    throw Error("'" + name + "' is not a parameter of this GPT (n_layer = " + std::to_string(config_.n_layer) + ")");
  return params_[it->second];
}

bool ParallelPlan::in_stage(const ParameterPlan& p, const StageSpec& s) const {
  switch (p.part) {
    case Part::Embedding: return s.has_embedding;
    case Part::Head: return s.has_head;
    case Part::Block: return p.layer >= s.first_layer && p.layer < s.last_layer;
  }
  return false;
}

std::vector<std::string> ParallelPlan::stage_parameters(const StageSpec& s) const {
  std::vector<std::string> names;
  for (const auto& p : params_)
    if (in_stage(p, s)) names.push_back(p.name);
  return names;
}

std::vector<std::vector<std::string>> ParallelPlan::units(const StageSpec& s) const {
  std::vector<std::vector<std::string>> out;
  int64_t current = -1;
  for (const auto& p : params_) {  // the table is in forward order, so a unit's parameters are adjacent
    if (!in_stage(p, s)) continue;
    if (p.unit != current) out.emplace_back(), current = p.unit;
    out.back().push_back(p.name);
  }
  return out;
}

bool ParallelPlan::is_replicated(const std::string& name, int tp) const {
  return tp > 1 && at(name).split == Split::Replicated;
}

std::vector<std::string> ParallelPlan::partial_gradient_parameters(const StageSpec& s, int tp,
                                                                   bool sequence_parallel) const {
  std::vector<std::string> names;
  if (!sequence_parallel || tp == 1) return names;
  for (const auto& p : params_)
    if (p.partial_under_sp && in_stage(p, s)) names.push_back(p.name);
  return names;
}

ShardSlice shard_slice(const ParameterPlan& p, int rank, int tp) {
  ShardSlice s;
  if (p.split == Split::Replicated || tp == 1) return s;
  s.dim = p.split == Split::Row ? 1 : 0;
  const int64_t part = p.shape[s.dim] / p.fused;
  if (p.shape[s.dim] % p.fused != 0 || part % tp != 0)
    throw UsageError("'" + p.name + "' (" + to_string(p.split) + "-parallel, " + std::to_string(p.shape[s.dim]) +
                     " along dimension " + std::to_string(s.dim) + ") does not split over " + std::to_string(tp) +
                     " tensor-parallel ranks");
  const int64_t length = part / tp;
  for (int64_t f = 0; f < p.fused; ++f) s.ranges.push_back({f * part + rank * length, length});
  return s;
}

std::vector<int64_t> shard_shape(const ParameterPlan& p, int tp) {
  const ShardSlice s = shard_slice(p, 0, tp);
  std::vector<int64_t> shape = p.shape;
  if (s.dim >= 0) {
    shape[s.dim] = 0;
    for (const auto& r : s.ranges) shape[s.dim] += r.length;
  }
  return shape;
}

void check_parallel_plan(const GPTConfig& c, int tp, bool sequence_parallel, int virtual_stages) {
  if (tp < 1) throw UsageError("parallel.tp must be at least 1");
  if (c.n_head % tp != 0)
    throw UsageError("model.n_head = " + std::to_string(c.n_head) + " is not divisible by parallel.tp = " +
                     std::to_string(tp) + "; attention is split by heads");
  if (c.is_llama() && c.kv_heads() % tp != 0)
    throw UsageError("model.n_kv_head = " + std::to_string(c.kv_heads()) + " is not divisible by parallel.tp = " +
                     std::to_string(tp) + "; each rank keeps the key/value heads of its query heads");
  if (c.is_llama() && c.mlp_hidden() % tp != 0)
    throw UsageError("the SwiGLU width (" + std::to_string(c.mlp_hidden()) + ", model.ffn_hidden) is not divisible by "
                     "parallel.tp = " + std::to_string(tp));
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

bool is_lora_adapter(const std::string& name) {
  return name.size() > 7 && (name.compare(name.size() - 7, 7, ".lora_A") == 0 || name.compare(name.size() - 7, 7, ".lora_B") == 0);
}

namespace {

// "3" or "0-5" -> [first, last]; false when `item` is not a block range.
bool parse_block_range(const std::string& item, int64_t& first, int64_t& last) {
  const auto dash = item.find('-');
  try {
    size_t used = 0;
    first = std::stoll(item.substr(0, dash), &used);
    if (used != (dash == std::string::npos ? item.size() : dash)) return false;
    last = dash == std::string::npos ? first : std::stoll(item.substr(dash + 1), &used);
    return dash == std::string::npos || used == item.size() - dash - 1;
  } catch (const std::exception&) {
    return false;
  }
}
}  // namespace

std::set<std::string> frozen_parameters(const ParallelPlan& plan, const GPTConfig& c, const std::string& spec) {
  std::string items = spec;
  if (items.empty() && c.lora_rank > 0) items = "all";
  std::set<std::string> frozen;
  size_t start = 0;
  while (start < items.size()) {
    size_t end = items.find(',', start);
    if (end == std::string::npos) end = items.size();
    std::string item = items.substr(start, end - start);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    start = end + 1;
    int64_t first = 0, last = 0;
    const bool range = parse_block_range(item, first, last);
    if (range && (first < 0 || last < first || last >= c.n_layer))
      throw UsageError("train.freeze: blocks '" + item + "' are outside the model's 0-" + std::to_string(c.n_layer - 1));
    if (!range && item != "all" && item != "embedding" && item != "head")
      throw UsageError("train.freeze: '" + item + "' is not \"embedding\", \"head\", \"all\", a block (\"3\") or a "
                       "range of blocks (\"0-5\")");
    for (const auto& p : plan.parameters()) {
      if (is_lora_adapter(p.name)) continue;  // adapters exist to be trained
      const bool hit = item == "all" || (item == "embedding" && p.part == Part::Embedding) ||
                       (item == "head" && p.part == Part::Head) ||
                       (range && p.part == Part::Block && p.layer >= first && p.layer <= last);
      if (hit) frozen.insert(p.name);
    }
  }
  if (frozen.size() == plan.parameters().size())
    throw UsageError("train.freeze = \"" + spec + "\" leaves nothing to train; freeze fewer parts or add LoRA "
                     "adapters (model.lora_rank)");
  return frozen;
}

double training_flops_per_token(const ParallelPlan& plan, const GPTConfig& c, const std::set<std::string>& frozen) {
  double flops = c.flops_per_token();
  for (const auto& p : plan.parameters()) {
    double n = 1;
    for (int64_t extent : p.shape) n *= static_cast<double>(extent);
    // An adapter is a trained matrix that flops_per_token does not know: forward, input and weight gradient.
    if (is_lora_adapter(p.name)) {
      flops += 6 * n;
      continue;
    }
    // A frozen matrix still multiplies forward and passes the gradient back, but gets no weight gradient: 2 of
    // its 6. Embedding lookups were never counted, except a tied head's multiply.
    const bool counted = p.part != Part::Embedding || (c.is_llama() && c.tie_embeddings && p.name == "wte.weight");
    if (frozen.count(p.name) && counted) flops -= 2 * n;
  }
  return flops;
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
  const double d = static_cast<double>(c.n_embd);
  const double block = c.is_llama() ? 2.0 * d * d + 2.0 * d * static_cast<double>(c.kv_heads() * c.head_dim()) +
                                          3.0 * d * static_cast<double>(c.mlp_hidden())
                                    : 12.0 * d * d;
  // The embedding is a lookup (cheap); the head is a d x V matmul plus the loss.
  return partition_layers(c.n_layer, stages, 0.1, static_cast<double>(c.n_embd * c.vocab_size) / block);
}

}  // namespace crosstrain::models
