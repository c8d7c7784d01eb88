// LoRA adapters (Hu et al. 2021): a frozen projection W gains a trainable low-rank update, y = W x + s B A x,
// A [r, in], B [out, r], s = lora_alpha / r. B starts at zero, so the adapted model starts as the base model.
// model.lora_rank > 0 adds them to the attention's query and value projections (the paper's choice): Llama's
// q_proj and v_proj, and the GPT's fused c_attn (q, k and v together). Their names are the projection's plus
// ".lora_A" / ".lora_B" ("h.3.attn.q_proj.lora_A"), declared in the parallel plan.
//
// Under tensor parallelism B is column-parallel like its projection and A is replicated: A x is computed on
// the rank's input before the region is entered, so the region's gathers and reductions give A the gradient of
// the whole output (partial only under sequence parallelism, like every replicated parameter).
#pragma once

#include <torch/torch.h>

#include "crosstrain/models/gpt_config.h"
#include "crosstrain/parallel/tp_layers.h"

namespace crosstrain::models {

struct LoraAdapter {
  torch::Tensor A, B;  // undefined: no adapter
  double scale = 1.0;
  bool enabled() const { return A.defined(); }
  // s B A x for this rank's output columns; x as the projection's caller holds it (before the region).
  torch::Tensor delta(const torch::Tensor& x, const parallel::TensorParallel& tp) const;
};

// Registers lora_A [r, in] and lora_B [out_local, r] on `projection` (a Linear at this rank's shard size) when
// config.lora_rank > 0; their values come from the plan's initialisation.
LoraAdapter add_lora(torch::nn::Module& projection, const GPTConfig& config, int64_t in_features,
                     int64_t out_features_local);

}  // namespace crosstrain::models
