// One training run of any model family: validates the config, builds the family's job (jobs/model_family.h) and
// drives it through the one training loop (train/loop.h). One Trainer per rank; the communicator decides who the
// other ranks are.
#pragma once

#include <memory>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/options.h"

namespace crosstrain::train {

// Checks a config for a job of `world` ranks without building anything (layout, batch divisibility, model
// shape, the data path exists). Throws UsageError with one clear line. The Trainer runs it too.
void check_config(const Config& config, int world);

class Trainer {
 public:
  // `world`: every rank of the job; the mesh (dp x pp x tp) is built from the config. Validated here.
  Trainer(Config config, comm::Communicator& world);
  ~Trainer();
  TrainResult run(const TrainOptions& options);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace crosstrain::train
