// The training loop: GPT, data, data-parallel reducer, AdamW with warmup + cosine, clipping, validation,
// metrics, checkpoints. One Trainer per rank; the communicator decides who the other ranks are.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/job.h"

namespace crosstrain::comm {
class HangDoctor;  // comm/hang_doctor.h
}

namespace crosstrain::train {

struct ParameterDump;  // test_hooks.h

struct TrainResult {
  std::vector<StepRecord> steps;   // the steps this run executed (after a resume: only the new ones)
  double val_loss = -1;            // last validation loss (-1: none)
  std::string sample;              // generated text (rank 0, when sample_tokens > 0)
  int64_t stopped_after = -1;      // stop_requested ended the run early after this step (-1: it ran to the end)
};

struct TrainOptions {
  bool resume = false;
  bool progress_bar = false;       // redraw one line (a terminal); otherwise plain lines every log_every
  bool quiet = false;              // no progress output at all (tests)
  // Polled at every step (sync.mode = "sync" only): once it returns true on any rank, all ranks stop together
  // after the next whole step, committing a pending asynchronous checkpoint and starting no new one.
  std::function<bool()> stop_requested;
  ParameterDump* dump = nullptr;   // tests (see test_hooks.h): filled with this rank's parameters when the run ends
  // Asks the other ranks through the control plane, when a collective times out, which of them never reached
  // it (comm/hang_doctor.h). Null: timeouts name this rank's side only.
  comm::HangDoctor* hang_doctor = nullptr;
};

// Checks a config for a job of `world` ranks without building anything (layout, batch divisibility, model
// shape, the data path exists). Throws UsageError with one clear line. The Trainer runs it too.
void check_config(const Config& config, int world);
// --resume from `checkpoint`, saved after `checkpoint_step`, with train.steps = `steps`: a checkpoint past the
// end of the run is refused (UsageError) rather than training a negative number of steps.
void check_resume_step(const std::string& checkpoint, int64_t checkpoint_step, int64_t steps);

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
