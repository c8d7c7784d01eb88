// Private to src/sync: one factory per sync mode, each defined in the mode's own file, so that build_strategy
// (strategy.cpp) chooses a mode without seeing its class. A factory takes the setup and the groups build_groups
// made for this rank; one that needs more groups of its own (the parameter server's) creates them, collectively
// over setup.dp, before it returns.
#pragma once

#include <memory>

#include "crosstrain/sync/strategy.h"
#include "strategy_base.h"

namespace crosstrain::train::sync_detail {

// sync_every_step.cpp: sync, flat (the gradient all-reduce over all replicas) or sync.hierarchical (inside each
// cluster, then one cross-cluster average of the gradients).
std::unique_ptr<SyncStrategy> make_sync_every_step(SyncSetup s, ClusterGroups g);
// diloco.cpp: DiLoCo, and streaming DiLoCo when sync.fragments > 1.
std::unique_ptr<SyncStrategy> make_diloco(SyncSetup s, ClusterGroups g);
// server_sync.cpp: ssp and async, workers of the sharded parameter server (param_server.h). Collective over
// s.dp: splits the parameter server's own group.
std::unique_ptr<SyncStrategy> make_server_sync(SyncSetup s, ClusterGroups g);
// gossip.cpp: pairwise averages with one neighbour every sync.period steps.
std::unique_ptr<SyncStrategy> make_gossip(SyncSetup s, ClusterGroups g);

}  // namespace crosstrain::train::sync_detail
