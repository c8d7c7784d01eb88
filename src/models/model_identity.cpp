#include "crosstrain/models/model_identity.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace crosstrain::models {

std::string shortest_number(double v) {
  char text[64];
  if (v == std::floor(v) && std::fabs(v) < 1e15) {  // whole numbers in full: 500000, not 5e+05
    std::snprintf(text, sizeof text, "%.0f", v);
    return text;
  }
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, v);
    if (std::strtod(text, nullptr) == v) break;
  }
  return text;
}

namespace {

// A config saved as TOML text reads back within rounding of the run's.
bool same_number(double a, double b) { return std::fabs(a - b) <= 1e-12 * std::max(std::fabs(a), std::fabs(b)); }

}  // namespace

std::vector<std::string> model_differences(const GPTConfig& saved, const GPTConfig& now) {
  std::vector<std::string> out;
  auto text = [&](const char* field, const std::string& a, const std::string& b) {
    if (a != b) out.push_back(std::string("model.") + field + ": " + a + " -> " + b);
  };
  auto integer = [&](const char* field, int64_t a, int64_t b) { text(field, std::to_string(a), std::to_string(b)); };
  auto number = [&](const char* field, double a, double b) {
    if (!same_number(a, b)) text(field, shortest_number(a), shortest_number(b));
  };
  text("arch", "\"" + std::string(to_string(saved.arch)) + "\"", "\"" + std::string(to_string(now.arch)) + "\"");
  if (saved.arch == ModelArch::Dlrm || now.arch == ModelArch::Dlrm) return out;  // the [dlrm] section holds the shape
  integer("n_layer", saved.n_layer, now.n_layer);
  integer("n_head", saved.n_head, now.n_head);
  integer("n_embd", saved.n_embd, now.n_embd);
  integer("vocab_size", saved.vocab_size, now.vocab_size);
  // gpt: the position table's rows; llama: what the weights were trained at (and the data's sequence length).
  integer("block_size", saved.block_size, now.block_size);
  integer("lora_rank", saved.lora_rank, now.lora_rank);
  if (saved.lora_rank > 0 && now.lora_rank > 0 && !same_number(saved.lora_scale(), now.lora_scale()))
    text("lora_alpha", shortest_number(saved.lora_alpha), shortest_number(now.lora_alpha));
  if (!saved.is_llama() || !now.is_llama()) return out;  // gpt ignores the rest
  // Both 0: they follow n_head and n_embd, already compared.
  if (saved.n_kv_head != 0 || now.n_kv_head != 0) integer("n_kv_head", saved.kv_heads(), now.kv_heads());
  if (saved.ffn_hidden != 0 || now.ffn_hidden != 0) integer("ffn_hidden", saved.mlp_hidden(), now.mlp_hidden());
  text("tie_embeddings", saved.tie_embeddings ? "true" : "false", now.tie_embeddings ? "true" : "false");
  number("rope_theta", saved.rope_theta, now.rope_theta);
  return out;
}

}  // namespace crosstrain::models
