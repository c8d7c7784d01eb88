// One training run of any model family: the config resolved once against the world size, the family's job
// (jobs/model_family.h), driven through the one training loop (train/loop.h). One Trainer per rank; the
// communicator decides who the other ranks are.
#pragma once

#include <memory>
#include <optional>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/parallel_dims.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/options.h"

namespace crosstrain::train {

// A config checked against the world size of its job, with what that check worked out: resolved once per
// process (by the command line, or by the Trainer given a bare Config) and handed down, so no layer below
// checks or derives it again.
struct ResolvedRun {
  Config config;
  int world = 1;
  // The layout of the families that train on a mesh (GPT, Llama): dp x pp x tp, ZeRO, micro-batches, stage
  // bounds. Empty for DLRM, whose tables are planned by its own job.
  std::optional<parallel::ParallelDims> dims;
};

// Checks `config` for a job of `world` ranks without building anything (layout, batch divisibility, model
// shape, the data path exists), through its model family. Throws UsageError with one clear line.
ResolvedRun resolve(const Config& config, int world);
// The GPT/Llama family's check (resolve() asks the family).
ResolvedRun resolve_decoder(const Config& config, int world);

class Trainer {
 public:
  // `world`: every rank of the job, as many as `run` was resolved for; the mesh (dp x pp x tp) is the run's.
  Trainer(ResolvedRun run, comm::Communicator& world);
  // Resolves `config` for `world` first.
  Trainer(Config config, comm::Communicator& world);
  ~Trainer();
  TrainResult run(const TrainOptions& options);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace crosstrain::train
