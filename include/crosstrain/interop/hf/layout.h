// Hugging Face's layout of a model, as transformers reads and writes it, mapped to crosstrain's: tensor names
// (crosstrain's plain names <-> GPT2LMHeadModel's and LlamaForCausalLM's), which weights are stored transposed
// (GPT-2's Conv1D), config.json <-> GPTConfig, and how an export is split into shard files. Pure: no libtorch;
// hf_checkpoint.h reads and writes the files. docs/huggingface.md lists every convention followed.
//
//   gpt (model_type "gpt2"):   "transformer." + crosstrain name ("transformer.h.3.attn.c_attn.weight"), except
//                              lm_head.weight; c_attn, c_proj and c_fc weights are [in, out] (Conv1D), crosstrain's
//                              [out, in] (torch Linear): transposed both ways
//   llama (model_type "llama"): model.embed_tokens, model.layers.{i}.input_layernorm, .self_attn.{q,k,v,o}_proj,
//                              .post_attention_layernorm, .mlp.{gate,up,down}_proj, model.norm, lm_head; same
//                              layout (rotate-half RoPE on both sides: no q/k permutation)
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::train::hf {

// One parameter of the model and where Hugging Face keeps it.
struct TensorMapping {
  std::string name;               // crosstrain's plain name: "h.3.attn.c_attn.weight"
  std::string hf_name;            // "transformer.h.3.attn.c_attn.weight"
  std::vector<int64_t> shape;     // crosstrain's ([out, in] for a weight)
  std::vector<int64_t> hf_shape;  // as stored by Hugging Face (reversed when transposed)
  bool transposed = false;        // GPT-2's Conv1D weights
};

// Every parameter of the model, in the parallel plan's order (embedding, blocks, head).
std::vector<TensorMapping> tensor_map(const models::GPTConfig& config);
// The Hugging Face name of a crosstrain parameter. Throws Error for a name the mapping does not know.
std::string hf_name(const models::GPTConfig& config, const std::string& name);
// The names an import also accepts for `hf_name`: checkpoints saved from the base model (GPT2Model,
// LlamaModel) lack the "transformer." / "model." prefix (openai-community/gpt2's own file does).
std::vector<std::string> hf_name_candidates(const models::GPTConfig& config, const std::string& hf_name);
// Tensors a Hugging Face file may hold that are not parameters, ignored on import: GPT-2's attention-mask
// buffers (attn.bias, attn.masked_bias), Llama's rotary inv_freq, a tied head's lm_head.weight.
bool ignorable_hf_tensor(const models::GPTConfig& config, bool tied_head, const std::string& hf_name);

// config.json for the model (transformers' keys for GPT2LMHeadModel / LlamaForCausalLM). `torch_dtype`:
// "float32", "bfloat16", ...
nlohmann::json config_to_hf(const models::GPTConfig& config, const std::string& torch_dtype);

struct HfConfig {
  models::GPTConfig model;
  // The head is the embedding matrix (GPT-2's default; Llama's tie_word_embeddings): lm_head.weight may be absent.
  bool tied_head = false;
  std::string torch_dtype;             // as written ("" when absent)
  std::vector<std::string> warnings;   // differences crosstrain accepts but the user should know of
};
// Reads config.json's object; keys transformers omits take transformers' defaults. Throws UsageError naming
// `source` and the key for a model crosstrain cannot build (another model_type, biases in Llama, rope_scaling,
// GPT-2 with n_inner != 4 n_embd, ...).
HfConfig config_from_hf(const nlohmann::json& json, const std::string& source);

// A field where the recipe's model section and the weights' config disagree.
struct ConfigMismatch {
  std::string field;    // "n_layer" (the recipe key model.<field>)
  std::string recipe;   // the recipe's value
  std::string weights;  // the weights' value (what --set should make it)
};
// The fields that shape the parameters must agree (arch, n_layer, n_head, n_embd, vocab_size, and for llama
// n_kv_head, ffn_hidden, tie_embeddings, rope_theta, norm_eps, compared by their effective values); block_size
// must agree for gpt (wpe's rows) and be at most the weights' for llama (no tensor depends on it). Dropout may
// differ (fine-tuning often changes it).
std::vector<ConfigMismatch> compare_model(const models::GPTConfig& recipe, const models::GPTConfig& weights);
// One message for a UsageError: each mismatch with both values and the `--set model.X=...` that fixes it.
std::string describe_mismatches(const std::vector<ConfigMismatch>& mismatches, const std::string& source);

// "5GB" (10^9, as transformers counts), "500MB", "2GiB" (2^30), "100KB", "4096" (bytes); case-insensitive.
// Throws UsageError for anything else or a size below 1 byte.
int64_t parse_size(const std::string& text);
// Splits tensors of `bytes` each (in order) into shards of at most `max_bytes`: a shard closes when the next
// tensor would overflow it, and a tensor larger than the limit gets a shard of its own. Returns the indices of
// each shard's tensors.
std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes);
// "model.safetensors" for one shard, else "model-00001-of-00003.safetensors" (1-based `index`).
std::string shard_file_name(size_t index, size_t count);

}  // namespace crosstrain::train::hf
