// Shape of a decoder-only language model of either family; no libtorch needed to read or check it.
//
//   arch = "gpt":   GPT-2 (LayerNorm with bias, learned positions, GELU MLP of 4 d, biased linears)
//   arch = "llama": Llama (RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention, no biases,
//                   optionally the head tied to the embedding)
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::models {

// model.arch, parsed once when the config is read: the families crosstrain trains. gpt and llama are decoders
// built by this layer; dlrm is a recommendation model whose shape is the [dlrm] section (recsys/dlrm_config.h).
// What each family does is registered in jobs/model_family.h; code asks that registry or compares this enum.
enum class ModelArch { Gpt, Llama, Dlrm };

// The name in a recipe ("gpt", "llama", "dlrm"); UsageError naming the choices for anything else.
ModelArch parse_model_arch(const std::string& name);
const char* to_string(ModelArch arch);

struct GPTConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 128;  // context length
  int64_t vocab_size = 256;
  double dropout = 0.0;

  ModelArch arch = ModelArch::Gpt;
  // Llama family (ignored by gpt, which has n_head key/value heads and a 4 d MLP):
  int64_t n_kv_head = 0;       // key/value heads of grouped-query attention; 0: n_head (multi-head)
  int64_t ffn_hidden = 0;      // SwiGLU width; 0: 8 d / 3 rounded up to a multiple of 32
  double rope_theta = 10000.0;  // rotary base
  double norm_eps = 1e-5;      // RMSNorm epsilon
  bool tie_embeddings = false;  // the head uses the embedding matrix (no lm_head.weight)
  // LoRA adapters on the attention's query and value projections (lora.h); 0: none.
  int64_t lora_rank = 0;
  double lora_alpha = 0;       // the update is scaled by lora_alpha / lora_rank; 0: lora_alpha = lora_rank
  double lora_scale() const { return lora_rank > 0 && lora_alpha > 0 ? lora_alpha / static_cast<double>(lora_rank) : 1.0; }

  bool is_llama() const { return arch == ModelArch::Llama; }
  int64_t head_dim() const { return n_embd / n_head; }
  int64_t kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  // The MLP's hidden width: 4 d for gpt, ffn_hidden (or its default) for llama.
  int64_t mlp_hidden() const;

  // Throws UsageError naming the field when the shape cannot work (n_embd % n_head != 0, ...).
  void validate() const;
  // Parameters, and training FLOPs per token: 6 N (N without the embedding tables) + 12 L T d,
  // as in the PaLM paper's MFU accounting.
  int64_t parameter_count() const;
  double flops_per_token() const;
};

// The [model] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(GPTConfig& c, Key&& key) {
  key("n_layer", c.n_layer, "transformer blocks");
  key("n_head", c.n_head, "attention heads (query heads for llama); n_embd must be a multiple");
  key("n_embd", c.n_embd, "model width d");
  key("block_size", c.block_size, "context length in tokens");
  key("vocab_size", c.vocab_size, "token ids 0..vocab_size-1 (256: bytes; a token file or tokenizer may say more)");
  key("dropout", c.dropout, "dropout probability in [0, 1) on attention, MLP and embeddings");
  key("arch", c.arch, parse_model_arch, to_string,
      "model family: gpt (LayerNorm, GELU, learned positions), llama (RMSNorm, SwiGLU, rotary) or dlrm ([dlrm])");
  key("n_kv_head", c.n_kv_head, "llama: key/value heads of grouped-query attention; 0: n_head");
  key("ffn_hidden", c.ffn_hidden, "llama: SwiGLU width; 0: 8 d / 3 rounded up to a multiple of 32");
  key("rope_theta", c.rope_theta, "llama: rotary position base");
  key("norm_eps", c.norm_eps, "llama: RMSNorm epsilon");
  key("tie_embeddings", c.tie_embeddings, "the output head reuses the embedding matrix");
  key("lora_rank", c.lora_rank, "LoRA adapters of this rank on the query and value projections; 0: none");
  key("lora_alpha", c.lora_alpha, "LoRA updates are scaled by lora_alpha / lora_rank; 0: lora_alpha = lora_rank");
}

}  // namespace crosstrain::models
