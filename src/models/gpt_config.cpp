#include "crosstrain/models/gpt_config.h"

#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::models {

void GPTConfig::validate() const {
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError("model: " + message);
  };
  need(n_layer >= 1, "n_layer must be at least 1, got " + std::to_string(n_layer));
  need(n_head >= 1, "n_head must be at least 1, got " + std::to_string(n_head));
  need(n_embd >= 1 && n_embd % n_head == 0,
       "n_embd (" + std::to_string(n_embd) + ") must be a positive multiple of n_head (" + std::to_string(n_head) + ")");
  need(block_size >= 1, "block_size must be at least 1, got " + std::to_string(block_size));
  need(vocab_size >= 2, "vocab_size must be at least 2, got " + std::to_string(vocab_size));
  need(dropout >= 0 && dropout < 1, "dropout must be in [0, 1), got " + std::to_string(dropout));
}

int64_t GPTConfig::parameter_count() const {
  const int64_t d = n_embd;
  const int64_t per_block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d);
  return vocab_size * d + block_size * d + n_layer * per_block + 2 * d + d * vocab_size;
}

double GPTConfig::flops_per_token() const {
  // Embedding lookups cost no multiply-adds: count the other parameters, plus attention's score and mix.
  const double matmul_params = static_cast<double>(parameter_count() - vocab_size * n_embd - block_size * n_embd);
  return 6.0 * matmul_params + 12.0 * static_cast<double>(n_layer * block_size * n_embd);
}

}  // namespace crosstrain::models
