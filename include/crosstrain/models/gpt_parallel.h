// A pipeline stage of the GPT (either family, gpt.h / llama.h) on one tensor-parallel rank: real blocks built at
// shard size for the
// rank's tensor-parallel context, plus the vocabulary-parallel embedding (first stage) and head (last stage).
// The parallel plan (parallel_plan.h) says how each parameter is split, replicated and grouped; the stage's
// parameters keep the single-device GPT's plain names ("h.3.attn.c_attn.weight").
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/models/parallel_plan.h"
#include "crosstrain/parallel/tp_layers.h"
#include "crosstrain/parallel/zero.h"

namespace crosstrain::models {

using TensorParallelContext = parallel::TensorParallel;

// This rank's slice of the full parameter `name` (plain names of the single-device GPT), as the plan splits it.
torch::Tensor shard_of(const ParallelPlan& plan, const std::string& name, const torch::Tensor& full, int tp_rank,
                       int tp_size);
// The same, building the plan from `config` (for callers that split a few tensors).
torch::Tensor shard_of(const std::string& name, const torch::Tensor& full, const GPTConfig& config, int tp_rank,
                       int tp_size);

class GPTStageImpl : public torch::nn::Module {
 public:
  // Draws this rank's shards of the single-device model of `seed` (gpt_init.h), one full parameter at a time,
  // so every layout starts from the same model without any rank building all of it.
  GPTStageImpl(const GPTConfig& config, StageSpec spec, TensorParallelContext tp, uint64_t seed);

  // First stage: tokens [B, T] -> hidden. Middle: hidden -> hidden. Hidden is [B, T, d], or [B, T/tp, d] with
  // sequence parallelism.
  torch::Tensor forward(const torch::Tensor& input);
  // Last stage: hidden (or tokens, for a single stage) -> mean cross-entropy against targets [B, T].
  torch::Tensor loss(const torch::Tensor& input, const torch::Tensor& targets);

  // One pipeline step of this stage: the first stage reads `tokens`, others the received `activation`; the
  // last returns its loss times `loss_scale` (1 / micro-batches), others the activation to send.
  torch::Tensor pipeline_forward(const torch::Tensor& activation, const torch::Tensor& tokens,
                                 const torch::Tensor& targets, double loss_scale);

  const StageSpec& spec() const { return spec_; }
  // This stage's parameters under their plain names ("h.3.attn.c_attn.weight"), sorted by name.
  const std::map<std::string, torch::Tensor>& named_shards() const { return params_; }
  // Replicated parameters whose gradients each tensor-parallel rank only has a part of (sequence parallel).
  std::vector<torch::Tensor> partial_gradient_parameters() const;
  // Whether a parameter is replicated over the tensor-parallel group (count it once in a gradient norm).
  bool is_replicated(const std::string& name) const;

  // The stage's parameters grouped the way ZeRO-3 gathers them, in forward order: the embedding, each block,
  // the head (plain names).
  std::vector<std::vector<std::string>> unit_names() const;
  // Called around each unit's forward (null: none). Not owned.
  void set_unit_hooks(parallel::UnitHooks* hooks) { hooks_ = hooks; }

  const ParallelPlan& plan() const { return plan_; }
  // train.recompute for every block of the stage (recompute.h).
  void set_recompute(Recompute r) {
    for (auto& block : blocks_) block->set_recompute(r);
  }

  // Submodules, present as the spec says (null otherwise); blocks are registered under "h.<layer>".
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};  // vocabulary-parallel, replicated (wpe: gpt only)
  torch::nn::ModuleDict h{nullptr};
  std::shared_ptr<torch::nn::Module> ln_f;  // LayerNorm (gpt) or RMSNorm (llama)
  torch::nn::Linear lm_head{nullptr};       // column-parallel over the vocabulary; null when tied to wte

 private:
  void build_modules(const torch::Tensor& mask);
  void initialize_shards(uint64_t seed);
  // tokens -> the first hidden state (this rank's sequence slice under sequence parallelism).
  torch::Tensor embed(const torch::Tensor& tokens);
  // Final LayerNorm, head and vocabulary-parallel loss.
  torch::Tensor head(const torch::Tensor& hidden, const torch::Tensor& targets);
  // Runs `f` on `x` as ZeRO unit `unit`, between the hooks.
  template <typename F>
  torch::Tensor run_unit(int unit, const torch::Tensor& x, F&& f);

  GPTConfig config_;
  StageSpec spec_;
  TensorParallelContext tp_;
  ParallelPlan plan_;
  std::vector<std::shared_ptr<DecoderBlockImpl>> blocks_;  // h's blocks, in order
  std::map<std::string, torch::Tensor> params_;  // the parameters by plain name
  parallel::UnitHooks* hooks_ = nullptr;
};
TORCH_MODULE(GPTStage);

}  // namespace crosstrain::models
