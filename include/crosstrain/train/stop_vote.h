// Stopping training early (Ctrl-C, SIGTERM) on every rank at the same step.
//
// Every `every` steps (StopCheck, chosen per sync mode) each rank posts its vote without waiting, and every rank
// reads the maximum `lag` steps later: all ranks get the same answer before the same step. Reading waits for the
// slowest rank to have posted, so the cadence is where the mode waits anyway: each step in lockstep training
// (read at the next one), each outer step in DiLoCo, every staleness + 1 steps in ssp (a rank that far ahead
// waits for the slowest in any case). async and gossip bound no drift, so a rank further ahead than the lag waits
// there: that is all the vote costs them.
//
// async ranks never wait for each other, and any vote read at a common step would make the fast ones wait for the
// slow: there the request travels with the parameter-server pushes (HeardStop below).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/job.h"
#include "crosstrain/train/sync_mode.h"

namespace crosstrain::train {

class StopVote {
 public:
  // `requested` is polled at each step that is a multiple of `check.every`; without it, or with `check.every` = 0
  // (async: HeardStop instead), nothing is exchanged.
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

// The stop of a run without a vote (Job::stop_check().every = 0: async). A rank asked to stop tells the parameter
// server with its pushes (Job::ask_to_stop), and every rank hears of it in a push's reply (Job::stop_heard),
// within sync.period of its own steps. On hearing, a rank says in one all-reduce which step it did last, and every
// rank trains on to the furthest of them and stops after it: the same step everywhere, and nobody waits except
// for that one exchange.
//
// The ranks also meet at steps whose outputs are collective (an evaluation, a checkpoint, the last step): a rank
// that comes to one without having heard joins the exchange there, saying so, before the step. Otherwise the
// exchange of a rank that heard would meet the other's evaluation, and each would wait for the other. A rank that
// heard is then at most at that step (it stops after the furthest step said), and an exchange in which nobody
// heard lets everyone go on: the ranks always make the same exchanges in the same order.
class HeardStop {
 public:
  // `meets(step)`: every rank runs something collective after `step` (TrainLoop::step_has_outputs).
  HeardStop(comm::Communicator& world, std::function<bool()> requested, Job& job,
            std::function<bool(int64_t)> meets);

  // Before `step`: true when the run stops after step - 1. Collective when this rank first hears, and before each
  // step that meets until a stop is agreed. That exchange waits, within the group timeout, for every rank to hear
  // or reach the step: no longer than the meeting itself waits for the slowest rank anyway.
  bool stops_before(int64_t step);

 private:
  comm::Communicator& world_;
  std::function<bool()> requested_;
  Job& job_;
  std::function<bool(int64_t)> meets_;
  bool asked_ = false;
  int64_t stop_after_ = -1;  // -1: no stop (yet)
};

}  // namespace crosstrain::train
