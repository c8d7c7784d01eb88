// The shape of a transformer as the planner sees it: enough to count parameters, FLOPs, activation bytes and the
// messages of every parallel layout. Pure: no libtorch, no communication.
//
//   ModelShape m = model_preset("gpt3-175b");
//   m.parameters();                 // 174.6e9
//   m.training_flops(300e9);        // 6 N D = 3.14e23
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::planner {

struct ModelShape {
  std::string name = "model";
  // Gpt (LayerNorm, GELU MLP of 4h, learned positions) or Llama (RMSNorm, SwiGLU, RoPE); the planner models decoders.
  models::ModelArch arch = models::ModelArch::Gpt;
  int64_t layers = 12;
  int64_t hidden = 768;
  int64_t heads = 12;
  int64_t kv_heads = 0;      // grouped-query attention; 0: heads
  int64_t ffn = 0;           // MLP inner width; 0: 4 * hidden (gpt)
  int64_t vocab = 50257;
  int64_t seq = 1024;        // training sequence length
  bool tied_embeddings = false;

  int64_t kv_heads_or_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t ffn_or_default() const { return ffn > 0 ? ffn : 4 * hidden; }
  int64_t head_dim() const { return hidden / heads; }

  // Parameters of one block, of the token (and position) embedding, of the output head (0 when tied), in all.
  double block_parameters() const;
  double embedding_parameters() const;
  double head_parameters() const;
  double parameters() const;
  // The parameters that multiply activations (every block's matrices and the head): the N of 6 N D.
  double matmul_parameters() const;

  // Training FLOPs per token, model FLOPs (what MFU counts): 6 N_matmul + 12 L s h (attention scores and mix,
  // the PaLM accounting). With full recompute the hardware runs one more forward of every block: + 2 N_block + 4 L s h.
  double flops_per_token() const;
  double hardware_flops_per_token(bool full_recompute) const;
  // The seeds' coarse totals over `tokens`: 6 N D and, with full recompute, 8 N D (N = parameters()).
  double training_flops(double tokens) const { return 6.0 * parameters() * tokens; }
  double training_flops_recompute(double tokens) const { return 8.0 * parameters() * tokens; }

  // Throws UsageError naming the field when the shape cannot work (hidden % heads, heads % kv_heads, ...).
  void validate() const;
  std::string describe() const;  // "gpt3-175b: 96 layers, hidden 12288, 96 heads, seq 2048, 174.6 B parameters"
};

// GPT-2 family (gpt2, gpt2-medium, gpt2-large, gpt2-xl), gpt3-175b (Brown et al. 2020, as Megatron trains it),
// llama-7b, llama-70b (Llama 2 shapes), and this repository's gpt-tiny and gpt-small. Throws UsageError listing
// the names for an unknown one.
ModelShape model_preset(const std::string& name);
std::vector<std::string> model_preset_names();
// The shape of crosstrain's own GPT (untied head, learned positions) from a recipe's [model].
ModelShape from_gpt_config(const models::GPTConfig& config, const std::string& name = "recipe");

}  // namespace crosstrain::planner
