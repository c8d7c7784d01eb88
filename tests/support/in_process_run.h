// One training job whose ranks are threads of this process (the in-process back end): every rank's result and
// parameter dump, for tests that compare runs step by step.
#pragma once

#include <mutex>
#include <vector>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"

namespace crosstrain::testing {

struct RankRun {
  train::TrainResult result;
  train::ParameterDump dump;  // parameters (flat and by name) and last-step gradients
};

// [rank] -> its run. Throws what a rank threw.
inline std::vector<RankRun> train_in_process(const train::Config& config, int ranks,
                                             comm::Millis timeout = comm::Millis(120000)) {
  std::vector<RankRun> runs(static_cast<size_t>(ranks));
  std::mutex m;
  comm::FakeWorld::run(ranks, [&](comm::Communicator& c) {
    train::Trainer trainer(config, c);
    train::TrainOptions options;
    options.quiet = true;
    RankRun run;
    options.dump = &run.dump;
    run.result = trainer.run(options);
    std::lock_guard<std::mutex> lock(m);
    runs[static_cast<size_t>(c.rank())] = std::move(run);
  }, timeout);
  return runs;
}

}  // namespace crosstrain::testing
