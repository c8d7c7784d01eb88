#include "crosstrain/models/gpt_config.h"

#include <string>

#include "crosstrain/core/error.h"
#include "crosstrain/core/named_enum.h"

namespace crosstrain::models {
namespace {

constexpr EnumName<ModelArch> kArchs[] = {{ModelArch::Gpt, "gpt"}, {ModelArch::Llama, "llama"}, {ModelArch::Dlrm, "dlrm"}};

}  // namespace

ModelArch parse_model_arch(const std::string& name) {
  for (const auto& a : kArchs)
    if (name == a.name) return a.value;
  throw UsageError("model.arch = '" + name + "' is not a model family crosstrain trains; choose one of gpt, llama, " +
                   "dlrm (a recommendation model with a [dlrm] section)");
}

const char* to_string(ModelArch arch) { return enum_name(kArchs, arch); }

void GPTConfig::validate() const {
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError("model: " + message);
  };
  need(n_layer >= 1, "n_layer must be at least 1, got " + std::to_string(n_layer));
  // Upper bounds far above any model trained today: a config from elsewhere (a Hugging Face config.json, a job
  // spec) that claims more is damaged or hostile, and its tables would be allocated before anything else failed.
  auto at_most = [&](const char* key, int64_t value, int64_t most) {
    need(value <= most, std::string(key) + " = " + std::to_string(value) + " is beyond crosstrain's bound of " +
                            std::to_string(most));
  };
  at_most("n_layer", n_layer, 4096);
  at_most("n_head", n_head, 4096);
  at_most("n_kv_head", n_kv_head, 4096);
  at_most("n_embd", n_embd, int64_t{1} << 17);
  at_most("block_size", block_size, int64_t{1} << 24);
  at_most("vocab_size", vocab_size, int64_t{1} << 24);
  at_most("ffn_hidden", ffn_hidden, int64_t{1} << 20);
  need(n_head >= 1, "n_head must be at least 1, got " + std::to_string(n_head));
  need(n_embd >= 1 && n_embd % n_head == 0,
       "n_embd (" + std::to_string(n_embd) + ") must be a positive multiple of n_head (" + std::to_string(n_head) + ")");
  need(block_size >= 1, "block_size must be at least 1, got " + std::to_string(block_size));
  need(vocab_size >= 2, "vocab_size must be at least 2, got " + std::to_string(vocab_size));
  need(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got " + std::to_string(dropout));
  if (arch == ModelArch::Dlrm) return;  // its shape is the [dlrm] section's (recsys/dlrm_config.h)
  need(lora_rank >= 0 && lora_alpha >= 0, "lora_rank and lora_alpha must not be negative (0: no adapters)");
  if (!is_llama()) return;
  need(n_kv_head >= 0 && n_head % kv_heads() == 0,
       "n_kv_head (" + std::to_string(n_kv_head) + ") must divide n_head (" + std::to_string(n_head) +
           "): each key/value head serves a group of query heads; 0 means n_head");
  need(head_dim() % 2 == 0, "rotary embeddings need an even head dimension (n_embd / n_head = " +
                                std::to_string(head_dim()) + ")");
  need(ffn_hidden >= 0, "ffn_hidden must be positive, or 0 for 8 n_embd / 3; got " + std::to_string(ffn_hidden));
  need(rope_theta > 0, "rope_theta must be positive");
  need(norm_eps > 0, "norm_eps must be positive");
}

int64_t GPTConfig::mlp_hidden() const {
  if (!is_llama()) return 4 * n_embd;
  if (ffn_hidden > 0) return ffn_hidden;
  const int64_t multiple = 32;  // the Llama papers round 2/3 of 4 d up to a multiple (256 at their widths)
  return (8 * n_embd / 3 + multiple - 1) / multiple * multiple;
}

int64_t GPTConfig::parameter_count() const {
  const int64_t d = n_embd;
  if (is_llama()) {
    const int64_t kv = kv_heads() * head_dim(), f = mlp_hidden();
    const int64_t per_block = 2 * d + d * d + 2 * d * kv + d * d + 3 * d * f;
    return vocab_size * d + n_layer * per_block + d + (tie_embeddings ? 0 : d * vocab_size);
  }
  const int64_t per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
  return vocab_size * d + block_size * d + n_layer * per_block + 2 * d + d * vocab_size;
}

double GPTConfig::flops_per_token() const {
  // Embedding lookups cost no multiply-adds: count the other parameters, plus attention's score and mix.
  // (A tied head still multiplies: count its matrix once.)
  const int64_t positions = is_llama() ? 0 : block_size * n_embd;
  const int64_t head = is_llama() && tie_embeddings ? vocab_size * n_embd : 0;
  const double matmul_params = static_cast<double>(parameter_count() - vocab_size * n_embd - positions + head);
  return 6.0 * matmul_params + 12.0 * static_cast<double>(n_layer * block_size * n_embd);
}

}  // namespace crosstrain::models
