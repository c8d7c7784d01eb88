// Stopping lockstep training early (Ctrl-C) on every rank at the same step.
//
// Each step every rank posts its vote and reads the maximum one step later: all ranks get the same answer at
// the same step, and the exchange has a whole step to finish, so it never holds one up. Other sync modes let
// ranks drift apart by design, where a per-step exchange would tie them together: they get no vote.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

class StopVote {
 public:
  // `requested` is polled once per step on this rank; without it there is no vote and nothing is exchanged.
  StopVote(comm::Communicator& world, std::function<bool()> requested);

  // Collective. Waits for the vote posted at the previous step: true when any rank asked to stop.
  bool agreed();
  // Collective. Posts this rank's vote, read by the next agreed().
  void post();
  // Waits for a vote still in flight: it refers to the communicator and its buffer. A request now is too late.
  void finish();

 private:
  comm::Communicator& world_;
  std::function<bool()> requested_;
  at::Tensor flag_;
  comm::WorkPtr exchange_;
};

}  // namespace crosstrain::train
