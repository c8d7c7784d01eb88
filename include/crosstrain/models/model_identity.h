// Whether two [model] sections describe the same tensors: what --resume needs before it loads a checkpoint into
// a model (train/resume_check.h). No libtorch needed.
#pragma once

#include <string>
#include <vector>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::models {

// Each field in which `now` gives the weights of `saved` another shape or meaning, as "model.FIELD: OLD -> NEW"
// (OLD from `saved`), in the order of GPTConfig: arch, n_layer, n_head, n_embd, vocab_size, block_size,
// lora_rank, lora_alpha (as the adapters' scale, when both have adapters), then for two llama models n_kv_head,
// ffn_hidden (their effective values: 0 means the default), tie_embeddings, rope_theta. Fields that change no
// tensor's meaning (dropout, norm_eps) are not compared. Two "dlrm" models compare equal here: their shape is the
// [dlrm] section's (recsys/dlrm_identity.h). Empty when the models match.
std::vector<std::string> model_differences(const GPTConfig& saved, const GPTConfig& now);

// "0.5", "10000", "1e-05": the shortest text that reads back as `v`.
std::string shortest_number(double v);

}  // namespace crosstrain::models
