// The GPT's parallelization plan: which linear is column- and which row-parallel, how the vocabulary and the
// sequence are split, and which layers a pipeline stage holds. The single-device GPT (gpt.h) stays the
// reference; a GPTStage holds this rank's shards of a contiguous range of it, under the same parameter names.
//
//   attention: c_attn column-parallel by heads (q, k and v each split), c_proj row-parallel
//   MLP:       c_fc column-parallel, c_proj row-parallel
//   wte:       vocabulary-parallel; lm_head column-parallel over the vocabulary, with vocab-parallel loss
//   wpe, LayerNorms, row-parallel biases: replicated (with sequence parallelism their gradients are partial
//   and are summed over the tensor-parallel group: see partial_gradient_parameters()).
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/parallel/tp_layers.h"
#include "crosstrain/parallel/zero.h"

namespace crosstrain::models {

using TensorParallelContext = parallel::TensorParallel;

// A pipeline stage (or, with one stage, the whole model) of a virtual stage index.
struct StageSpec {
  int64_t first_layer = 0;  // blocks [first_layer, last_layer)
  int64_t last_layer = 0;
  bool has_embedding = false;
  bool has_head = false;
};

// This rank's slice of the full parameter `name` (plain names of the single-device GPT).
torch::Tensor shard_of(const std::string& name, const torch::Tensor& full, const GPTConfig& config, int tp_rank,
                       int tp_size);

// Throws UsageError when the model cannot be split this way (heads, width or vocabulary not divisible by tp,
// sequence not divisible with sequence parallelism, more stages than layers).
void check_parallel_plan(const GPTConfig& config, int tp, bool sequence_parallel, int virtual_stages);

// Contiguous split of the blocks over `stages` virtual stages, balancing a per-layer cost estimate:
// a block costs 1; the embedding adds `embed_cost` to the first stage and the head `head_cost` to the last.
// Pure. Returns the first block of each stage plus the end (stages + 1 numbers).
std::vector<int64_t> partition_layers(int64_t layers, int stages, double embed_cost, double head_cost);
// The costs partition_layers uses for a GPT (head and embedding relative to a block, by parameter count).
std::vector<int64_t> partition_gpt(const GPTConfig& config, int stages);

class GPTStageImpl : public torch::nn::Module {
 public:
  // Copies this rank's shards from `full` (the single-device model built from the seed), so every layout starts
  // from the same model.
  GPTStageImpl(const GPTConfig& config, StageSpec spec, TensorParallelContext tp, GPT& full);

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
  std::vector<torch::Tensor> partial_gradient_parameters();
  // Whether a parameter is replicated over the tensor-parallel group (count it once in a gradient norm).
  bool is_replicated(const std::string& name) const;

  // The stage's parameters grouped the way ZeRO-3 gathers them, in forward order: the embedding, each block,
  // the head (plain names).
  std::vector<std::vector<std::string>> unit_names() const;
  // Called around each unit's forward (null: none). Not owned.
  void set_unit_hooks(parallel::UnitHooks* hooks) { hooks_ = hooks; }

 private:
  torch::Tensor attention(int64_t layer, const torch::Tensor& x);
  torch::Tensor mlp(int64_t layer, const torch::Tensor& x);
  // Final LayerNorm, head and loss.
  torch::Tensor head(const torch::Tensor& hidden, const torch::Tensor& targets);
  torch::Tensor& p(const std::string& name);

  GPTConfig config_;
  StageSpec spec_;
  TensorParallelContext tp_;
  std::map<std::string, torch::Tensor> params_;
  torch::Tensor causal_mask_;  // [block_size, block_size], true above the diagonal; built once
  parallel::UnitHooks* hooks_ = nullptr;
};
TORCH_MODULE(GPTStage);

}  // namespace crosstrain::models
