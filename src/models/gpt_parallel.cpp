#include "crosstrain/models/gpt_parallel.h"

#include "crosstrain/core/error.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/models/llama.h"
#include "crosstrain/models/mixed_precision.h"
#include "crosstrain/parallel/tensor_parallel.h"

namespace crosstrain::models {
namespace tp = parallel::tp;

torch::Tensor shard_of(const ParallelPlan& plan, const std::string& name, const torch::Tensor& full, int r, int n) {
  return shard_of(plan.at(name), full, r, n);
}

torch::Tensor shard_of(const std::string& name, const torch::Tensor& full, const GPTConfig& c, int r, int n) {
  return shard_of(ParallelPlan(c), name, full, r, n);
}

GPTStageImpl::GPTStageImpl(const GPTConfig& config, StageSpec spec, TensorParallelContext tp, uint64_t seed)
    : config_(config), spec_(spec), tp_(tp), plan_(config) {
  check_parallel_plan(config, tp.size, tp.sequence_parallel, 1);
  build_modules(causal_mask(config.block_size));  // one mask for all the stage's blocks
  initialize_shards(seed);
}

// The same modules as the single-device GPT, at this rank's shard size, registered in its parameter order.
void GPTStageImpl::build_modules(const torch::Tensor& mask) {
  const int64_t d = config_.n_embd;
  if (spec_.has_embedding) {
    wte = register_module("wte", torch::nn::Embedding(config_.vocab_size / tp_.size, d));
    if (!config_.is_llama()) wpe = register_module("wpe", torch::nn::Embedding(config_.block_size, d));
  }
  const RotaryTables rope =
      config_.is_llama() ? rotary_tables(config_.block_size, config_.head_dim(), config_.rope_theta) : RotaryTables{};
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> named_blocks;
  for (int64_t i = spec_.first_layer; i < spec_.last_layer; ++i) {
    blocks_.push_back(make_block(config_, tp_, mask, rope));
    named_blocks.emplace_back(std::to_string(i), blocks_.back());
  }
  h = register_module("h", torch::nn::ModuleDict(named_blocks));
  if (spec_.has_head) {
    if (config_.is_llama() && config_.tie_embeddings && !spec_.has_embedding)
      throw UsageError("model.tie_embeddings: the head and the embedding must be on the same pipeline stage "
                       "(use parallel.pp = 1, or tie_embeddings = false)");
    ln_f = register_module("ln_f", make_final_norm(config_));
    if (!(config_.is_llama() && config_.tie_embeddings))
      lm_head = register_module(
          "lm_head", torch::nn::Linear(torch::nn::LinearOptions(d, config_.vocab_size / tp_.size).bias(false)));
  }
}

// Every layout starts from the same model: each parameter is drawn whole from its own generator (gpt_init.h),
// as the single-device GPT draws it, and only this rank's shard is kept. One full parameter is alive at a time.
void GPTStageImpl::initialize_shards(uint64_t seed) {
  torch::NoGradGuard no_grad;
  for (auto& item : named_parameters()) {
    torch::Tensor shard = initial_shard(plan_.at(item.key()), seed, tp_.rank, tp_.size);
    if (shard.sizes() != item.value().sizes())
      throw Error("GPT stage: '" + item.key() + "' is built as " + c10::str(item.value().sizes()) +
                  " but the plan's shard is " + c10::str(shard.sizes()));
    item.value().copy_(shard);
    params_[item.key()] = item.value();
  }
  if (named_parameters().size() != plan_.stage_parameters(spec_).size())
    throw Error("GPT stage: its modules and the parallel plan disagree on the stage's parameters");
}

template <typename F>
torch::Tensor GPTStageImpl::run_unit(int unit, const torch::Tensor& x, F&& f) {
  if (hooks_) hooks_->before_unit(unit);
  torch::Tensor out = f(x);
  return hooks_ ? hooks_->after_unit(unit, out) : out;
}

torch::Tensor GPTStageImpl::embed(const torch::Tensor& tokens) {
  auto emb = parallel::vocab_parallel_embedding(tokens, wte->weight, tp_);
  if (!wpe) return torch::dropout(emb, config_.dropout, is_training());  // llama: positions are rotary
  auto pos = wpe->weight.slice(0, 0, tokens.size(1));
  if (tp_.sequence_parallel) pos = pos.chunk(tp_.size, 0)[tp_.rank];  // this rank's slice of the sequence
  return torch::dropout(emb + pos, config_.dropout, is_training());
}

torch::Tensor GPTStageImpl::forward(const torch::Tensor& input) {
  torch::Tensor x = input;
  int unit = 0;
  if (spec_.has_embedding) x = run_unit(unit++, x, [&](const torch::Tensor& t) { return embed(t); });
  for (auto& block : blocks_) x = run_unit(unit++, x, [&](const torch::Tensor& t) { return block->forward(t); });
  return x;
}

torch::Tensor GPTStageImpl::loss(const torch::Tensor& input, const torch::Tensor& targets) {
  return head(forward(input), targets);
}

torch::Tensor GPTStageImpl::head(const torch::Tensor& hidden, const torch::Tensor& targets) {
  const int unit = (spec_.has_embedding ? 1 : 0) + static_cast<int>(blocks_.size());
  return run_unit(unit, hidden, [&](const torch::Tensor& x) {
    const torch::Tensor& weight = lm_head ? lm_head->weight : wte->weight;  // tied: the embedding's rows
    auto logits = parallel::column_parallel_linear(apply_final_norm(ln_f, x), weight, torch::Tensor(), tp_);
    return tp::vocab_parallel_cross_entropy(logits, targets, tp_.rank * weight.size(0), tp_.group);
  });
}

torch::Tensor GPTStageImpl::pipeline_forward(const torch::Tensor& activation, const torch::Tensor& tokens,
                                             const torch::Tensor& targets, double loss_scale) {
  const torch::Tensor& in = spec_.has_embedding ? tokens : activation;
  return spec_.has_head ? loss(in, targets) * loss_scale : forward(in);
}

std::vector<std::vector<std::string>> GPTStageImpl::unit_names() const { return plan_.units(spec_); }

bool GPTStageImpl::is_replicated(const std::string& name) const { return plan_.is_replicated(name, tp_.size); }

std::vector<torch::Tensor> GPTStageImpl::partial_gradient_parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& name : plan_.partial_gradient_parameters(spec_, tp_.size, tp_.sequence_parallel))
    out.push_back(params_.at(name));
  return out;
}

}  // namespace crosstrain::models
