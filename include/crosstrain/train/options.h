// What a caller asks of one training run, and what the run gives back: shared by the loop (train/loop.h) and
// the jobs that drive it (jobs/trainer.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crosstrain/train/job.h"

namespace crosstrain::comm {
class HangDoctor;  // comm/diagnostics/hang_doctor.h
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
  // it (comm/diagnostics/hang_doctor.h). Null: timeouts name this rank's side only.
  comm::HangDoctor* hang_doctor = nullptr;
};

}  // namespace crosstrain::train
