// Shape of a GPT model; no libtorch needed to read or check it.
#pragma once

#include <cstdint>

namespace crosstrain::models {

struct GPTConfig {
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  int64_t block_size = 128;  // context length
  int64_t vocab_size = 256;
  double dropout = 0.0;

  // Throws UsageError naming the field when the shape cannot work (n_embd % n_head != 0, ...).
  void validate() const;
  // Parameters, and training FLOPs per token: 6 N (N without the embedding tables) + 12 L T d,
  // as in the PaLM paper's MFU accounting.
  int64_t parameter_count() const;
  double flops_per_token() const;
};

}  // namespace crosstrain::models
