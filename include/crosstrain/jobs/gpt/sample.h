// Text generation after training, in any layout: the whole model is read back from a checkpoint (which holds
// every parameter however the run was split) into the single-device GPT, which generates.
#pragma once

#include <string>

#include "crosstrain/train/config.h"

namespace crosstrain::train {

// `config.train.sample_tokens` tokens after a newline prompt (temperature 0.8, top-k 40, seeded by run.seed),
// decoded as bytes.
std::string sample_text(const Config& config, const std::string& checkpoint_dir);

}  // namespace crosstrain::train
