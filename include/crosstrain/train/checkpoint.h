// Checkpoints: RUN_DIR/checkpoints/step_NNNNNNNN/ holding, for every model-parallel shard (pipeline stage x
// tensor-parallel rank), model-ppP-tpT.safetensors (plain parameter names, per-tensor checksums in the
// metadata) and optimizer-ppP-tpT.pt, plus state.json (step, data position, layout, config).
// Writers put their files into step_N.tmp/; after a barrier rank 0 writes state.json, syncs and renames the
// directory: a checkpoint is complete or absent. Loading needs the same pp x tp layout (resharding comes with
// the distributed-checkpoint work).
#pragma once

#include <torch/torch.h>

#include <map>
#include <optional>
#include <string>

#include "crosstrain/data/sampler.h"

namespace crosstrain::train {

struct CheckpointState {
  int64_t step = 0;  // last completed step
  data::SamplerState sampler;
  std::string config_toml;
  int pp = 1, tp = 1;
};

std::string shard_name(int pp_index, int tp_index);

// Phase 1, on every shard writer (data-parallel index 0): writes into the temporary directory.
void write_checkpoint_shard(const std::string& run_dir, int64_t step, const std::string& shard,
                            const std::map<std::string, torch::Tensor>& parameters, torch::optim::Optimizer& optimizer);
// Phase 2, on one rank after every shard is written: state.json, sync, rename. Returns the final directory.
std::string commit_checkpoint(const std::string& run_dir, const CheckpointState& state);
// The newest complete checkpoint of a run, if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// Reads state.json and checks the layout. Throws UsageError naming the file.
CheckpointState read_checkpoint_state(const std::string& dir, int pp, int tp);
// Loads one shard into `parameters` and `optimizer`. Throws UsageError naming the file when it is missing,
// truncated, corrupt or from another model.
void load_checkpoint_shard(const std::string& dir, const std::string& shard,
                           const std::map<std::string, torch::Tensor>& parameters, torch::optim::Optimizer& optimizer);

}  // namespace crosstrain::train
