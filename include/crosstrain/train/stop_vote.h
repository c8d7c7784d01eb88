// Stopping training early (Ctrl-C) on every rank at the same step.
//
// At every step where the ranks meet anyway (each step in lockstep training, each outer step in DiLoCo; see
// Job::meets_every) every rank posts its vote, and reads the maximum one step later: all ranks get the same
// answer after the same step, and the exchange has a whole step to finish, so it never holds one up. Modes whose
// ranks drift apart by design (ssp, async, gossip) would be tied together by any exchange: they get no vote.
#pragma once

#include <ATen/ATen.h>

#include <functional>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

class StopVote {
 public:
  // `requested` is polled at each step that is a multiple of `every`; without it, or with `every` = 0, there is
  // no vote and nothing is exchanged.
  StopVote(comm::Communicator& world, std::function<bool()> requested, int64_t every);

  // Collective. Waits for the vote posted at the previous step: true when any rank asked to stop.
  bool agreed();
  // Collective at the steps that are multiples of `every`: posts this rank's vote before `step` runs, read by the
  // agreed() after it (so a run stops after such a step).
  void post(int64_t step);
  // Waits for a vote still in flight: it refers to the communicator and its buffer. A request now is too late.
  void finish();

 private:
  comm::Communicator& world_;
  std::function<bool()> requested_;
  int64_t every_;
  at::Tensor flag_;
  comm::WorkPtr exchange_;
};

}  // namespace crosstrain::train
