// Checkpoints of a data-parallel run: RUN_DIR/checkpoints/step_NNNNNNNN/{model.pt, optimizer.pt, state.json}.
// Written by one rank (data-parallel replicas are identical) into a temporary directory that is synced and
// renamed into place, so a checkpoint directory is complete or absent. (Sharded checkpoints come later.)
#pragma once

#include <torch/torch.h>

#include <optional>
#include <string>

#include "crosstrain/data/sampler.h"

namespace crosstrain::train {

struct CheckpointState {
  int64_t step = 0;                // last completed step
  data::SamplerState sampler;
  std::string config_toml;
};

// Returns the final directory.
std::string save_checkpoint(const std::string& run_dir, const CheckpointState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer);
// The newest complete checkpoint of a run, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// Loads into `model` and `optimizer` (which must have the checkpoint's shapes). Throws UsageError naming the
// file when it is missing, truncated, corrupt or from another model.
CheckpointState load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& optimizer);

}  // namespace crosstrain::train
