// The model's parallel plan as one table (the GPT's below; the Llama family's in add_llama, parallel_plan.cpp):
// for each parameter of the single-device GPT (gpt.h), how it is split
// over the tensor-parallel group, whether its gradient is partial under sequence parallelism, which ZeRO unit
// gathers it and which part of the model (embedding, block i, head) holds it. Shards, replication, ZeRO units
// and a pipeline stage's parameter list are all read from this table; nothing else looks at parameter names.
// Pure: no libtorch.
//
//   attention: c_attn column-parallel by heads (q, k and v each split), c_proj row-parallel
//   MLP:       c_fc column-parallel, c_proj row-parallel
//   wte:       vocabulary-parallel; lm_head column-parallel over the vocabulary (vocab-parallel loss)
//   wpe, LayerNorms, row-parallel biases: replicated (the bias is added once, after the reduction)
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::models {

// How a parameter is split over the tensor-parallel group (Megatron's layers).
enum class Split {
  Replicated,  // every rank holds all of it
  Column,      // output features (dim 0) split; a fused weight ([q; k; v]) splits each of its parts
  Row,         // input features (dim 1) split
  Vocabulary,  // vocabulary rows (dim 0) split
};
const char* to_string(Split split);

// The part of the model a parameter belongs to.
enum class Part { Embedding, Block, Head };

// How a parameter starts (GPT-2 scheme): weights and embeddings N(0, init_std), LayerNorm gains 1, biases 0.
// Kept in the plan so the single-device GPT and every stage draw the same values (gpt_init.h).
enum class Init { Normal, Ones, Zeros };

struct ParameterPlan {
  std::string name;            // plain name in the single-device GPT: "h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;  // unsplit
  Split split = Split::Replicated;
  int64_t fused = 1;           // matrices stacked along the split dimension (3 for c_attn: q, k, v)
  // Sequence parallel: the parameter acts on this rank's slice of the sequence only, so its gradient is a
  // part of the whole and is summed over the tensor-parallel group.
  bool partial_under_sp = false;
  Part part = Part::Block;
  int64_t layer = -1;          // the block, for Part::Block
  int64_t unit = 0;            // ZeRO unit, model-wide: 0 the embedding, 1 + layer a block, n_layer + 1 the head
  Init init = Init::Zeros;
  // Init::Normal: 0.02, or 0.02 / sqrt(2 n_layer) for the projections into the residual stream (one per
  // residual add, so the stream's variance does not grow with depth).
  double init_std = 0.0;
};

// A pipeline stage (or, with one stage, the whole model) of a virtual stage index.
struct StageSpec {
  int64_t first_layer = 0;  // blocks [first_layer, last_layer)
  int64_t last_layer = 0;
  bool has_embedding = false;
  bool has_head = false;
};

// The piece of a parameter one tensor-parallel rank holds: `ranges` (start, length) of dimension `dim`,
// concatenated in order (one per fused matrix). dim < 0: the whole tensor.
struct ShardSlice {
  struct Range {
    int64_t start = 0, length = 0;
  };
  int dim = -1;
  std::vector<Range> ranges;
};
// Throws UsageError when the split dimension does not divide over `tp` ranks.
ShardSlice shard_slice(const ParameterPlan& p, int rank, int tp);
// The shape every rank's shard has.
std::vector<int64_t> shard_shape(const ParameterPlan& p, int tp);

class ParallelPlan {
 public:
  explicit ParallelPlan(const GPTConfig& config);

  // Every parameter, in the single-device GPT's parameter order (embedding, blocks, head).
  const std::vector<ParameterPlan>& parameters() const { return params_; }
  bool contains(const std::string& name) const { return index_.count(name) > 0; }
  // Throws Error for a name that is not a parameter of this GPT.
  const ParameterPlan& at(const std::string& name) const;

  bool in_stage(const ParameterPlan& p, const StageSpec& stage) const;
  // The stage's parameter names, in order.
  std::vector<std::string> stage_parameters(const StageSpec& stage) const;
  // The stage's parameters grouped the way ZeRO-3 gathers them, in forward order: the embedding, each block,
  // the head.
  std::vector<std::vector<std::string>> units(const StageSpec& stage) const;
  // Whether every rank of a tensor-parallel group of `tp` holds all of it (count it once in a gradient norm).
  bool is_replicated(const std::string& name, int tp) const;
  // The stage's parameters whose gradients each rank only has a part of (empty without sequence parallelism).
  std::vector<std::string> partial_gradient_parameters(const StageSpec& stage, int tp, bool sequence_parallel) const;

 private:
  void add_gpt();
  void add_llama();
  void add_lora(const std::string& projection, int64_t in, int64_t out, int64_t layer, int64_t fused);
  void add(std::string name, std::vector<int64_t> shape, Split split, Init init, double init_std, Part part,
           int64_t layer, int64_t fused = 1);

  GPTConfig config_;
  std::vector<ParameterPlan> params_;
  std::map<std::string, size_t> index_;
};

// Throws UsageError when the model cannot be split this way (heads, width or vocabulary not divisible by tp,
// sequence not divisible with sequence parallelism, more stages than layers).
void check_parallel_plan(const GPTConfig& config, int tp, bool sequence_parallel, int virtual_stages);

// Whether `name` is a LoRA adapter ("h.3.attn.q_proj.lora_A", lora.h).
bool is_lora_adapter(const std::string& name);

// train.freeze: the parameters a fine-tuning run keeps fixed. `spec` is a comma list of "embedding", "head",
// block indices "3" or ranges "0-5", and "all" (every parameter that is not a LoRA adapter); "" freezes nothing,
// or everything but the adapters when the model has LoRA adapters. Throws UsageError on an unknown item or a
// block outside the model, and when nothing would be left to train.
std::set<std::string> frozen_parameters(const ParallelPlan& plan, const GPTConfig& config, const std::string& spec);
// The FLOPs a training step spends per token (MFU's numerator): GPTConfig::flops_per_token (6 per multiplying
// parameter, plus attention), less the weight gradients of `frozen` matrices (2 per parameter), plus LoRA
// adapters (6 per parameter). Pure.
double training_flops_per_token(const ParallelPlan& plan, const GPTConfig& config, const std::set<std::string>& frozen);

// Contiguous split of the blocks over `stages` virtual stages, balancing a per-layer cost estimate:
// a block costs 1; the embedding adds `embed_cost` to the first stage and the head `head_cost` to the last.
// Returns the first block of each stage plus the end (stages + 1 numbers).
std::vector<int64_t> partition_layers(int64_t layers, int stages, double embed_cost, double head_cost);
// The costs partition_layers uses for a GPT (head and embedding relative to a block, by parameter count).
std::vector<int64_t> partition_gpt(const GPTConfig& config, int stages);

}  // namespace crosstrain::models
