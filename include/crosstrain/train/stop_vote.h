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
// for that one exchange. A rank that comes to the run's last step without having heard joins the exchange there,
// saying so (a run whose ranks all get there without a request just goes on: async meets at its end anyway).
class HeardStop {
 public:
  HeardStop(comm::Communicator& world, std::function<bool()> requested, Job& job, int64_t last_step);

  // Before `step`: true when the run stops after step - 1 (collective once, when this rank first hears, or before
  // the last step). That exchange waits, within the group timeout, for every rank to hear or reach the last step:
  // no longer than async's final barrier waits for the slowest rank anyway.
  bool stops_before(int64_t step);

 private:
  comm::Communicator& world_;
  std::function<bool()> requested_;
  Job& job_;
  const int64_t last_step_;
  bool asked_ = false, exchanged_ = false;
  int64_t stop_after_ = -1;  // -1: no stop (yet)
};

}  // namespace crosstrain::train
