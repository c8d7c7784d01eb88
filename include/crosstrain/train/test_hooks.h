// Test hooks: what parity tests read out of a run and production code never needs.
//
// A test points TrainOptions::dump at a ParameterDump of its own (one per rank: ranks may be threads of one
// process) and reads it after Trainer::run returns. Nothing is copied when it is null, the default. A run
// stopped early (TrainOptions::stop_requested) leaves it as it was.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <vector>

namespace crosstrain::train {

struct ParameterDump {
  // This rank's parameters after the last step, flattened in name order, as fp32. Under ZeRO-3 they are
  // gathered first, so every rank's dump holds its whole (tensor-parallel / pipeline) share of the model.
  std::vector<float> flat;
  // The same parameters by plain name (this rank's shard of each: its tensor-parallel slice, its stage's).
  std::map<std::string, at::Tensor> shards;
  // Their gradients in the last step, after clipping, before the optimizer step. Empty under ZeRO, whose
  // gradients live in per-rank slices rather than whole tensors.
  std::map<std::string, at::Tensor> gradients;
};

}  // namespace crosstrain::train
