// The reference model `plan --calibrate` times: our own GPT, forward and backward of one micro-batch on this
// thread, so the planner can learn how far this host's eager step is from its product/pass/operator model.
#pragma once

#include <cstdint>
#include <string>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::apps {

// Median seconds of forward + loss + backward of `micro_batch` sequences of `config` in `dtype` (fp32 or bf16:
// bf16 parameters, fp32 loss, as train.precision = bf16 computes), after a warm-up, over about `seconds`.
double reference_step_seconds(const models::GPTConfig& config, int64_t micro_batch, const std::string& dtype,
                              double seconds);

}  // namespace crosstrain::apps
