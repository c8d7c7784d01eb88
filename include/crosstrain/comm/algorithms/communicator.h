// comm.algo: a communicator whose all-reduce, reduce-scatter, all-gather and broadcast run our algorithms
// (comm/algorithms/collectives.h) over the wrapped communicator's point-to-point messages instead of the back end's own
// collectives.
//
// `algo` names one algorithm for every call (ring, tree, hd, hierarchical) or `auto`: per operation and size, the
// algorithm the cost model (comm/cost_model.h) predicts fastest on this group's topology. The hosts are the group
// members' host names, gathered when the wrapper is made; the links come from a topology file when one is given
// (every rank must read the same: this is checked), else they are this machine's defaults. Hierarchical groups the
// ranks of each host (the same count on every host, consecutive ranks).
// Calls run in order on one worker thread per group, so they stay asynchronous (the gradient reducer overlaps them
// with backward); every other operation, and buffers the algorithms do not take (non-contiguous, half, bfloat16,
// bool, complex), go to the wrapped communicator. Groups made by split() are wrapped the same way.
#pragma once

#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/config.h"

namespace crosstrain::comm {

// Collective over `inner` (it gathers host names, and for hierarchical splits the groups). Uses config.algo and
// config.topology (checked with validate, comm/config.h). Returns `inner` unchanged for builtin or a group of one.
std::unique_ptr<Communicator> with_algorithms(std::unique_ptr<Communicator> inner, const CommConfig& config);

}  // namespace crosstrain::comm
