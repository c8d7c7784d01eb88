// Stopping training early (Ctrl-C, SIGTERM) on every rank at the same step.
//
// Every `every` steps (StopCheck, chosen per sync mode) each rank posts its vote without waiting, and every rank
// reads the maximum `lag` steps later: all ranks get the same answer before the same step. Reading waits for the
// slowest rank to have posted, so the cadence is where the mode waits anyway: each step in lockstep training
// (read at the next one), each outer step in DiLoCo, every staleness + 1 steps in ssp (a rank that far ahead
// waits for the slowest in any case). async and gossip bound no drift, so a rank further ahead than the lag waits
// there: that is all the vote costs them.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/sync_mode.h"

namespace crosstrain::train {

class StopVote {
 public:
  // `requested` is polled at each step that is a multiple of `check.every`; without it nothing is exchanged.
  StopVote(comm::Communicator& world, std::function<bool()> requested, StopCheck check);

  // Collective before `step`: true when any rank asked to stop in the vote posted `check.lag` steps ago (the run
  // then stops after step - 1). Before that, and between votes, returns false without waiting.
  bool agreed(int64_t step);
  // Collective at the steps that are multiples of `check.every`: posts this rank's vote before `step` runs.
  void post(int64_t step);
  // Waits for a vote still in flight: it refers to the communicator and its buffer. A request now is too late.
  void finish();

 private:
  comm::Communicator& world_;
  std::function<bool()> requested_;
  StopCheck check_;
  at::Tensor flag_;
  comm::WorkPtr exchange_;
  int64_t posted_at_ = 0;
};

}  // namespace crosstrain::train
