// The launcher's part in elastic training: on node 0 it runs the membership coordinator beside the rendezvous
// store; on every node it restarts failed ranks (--max-restarts, all ranks together) and ends the ranks that the
// coordinator excluded alive (a hung rank, the rest of a failed replica) so that they restart too.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/elastic/coordinator.h"

namespace crosstrain::apps {

struct ElasticLaunch {
  bool enabled = false;
  int max_restarts = 0;  // restarts of failed ranks, all ranks of this node together
  int min_nnodes = 0;    // --nnodes MIN:MAX: the job starts once MIN nodes' ranks are there; 0: every node
};

class ElasticSupervisor {
 public:
  // `store`: the rendezvous store this launcher hosts (node 0), or null. `ranks_per_node`: for --nnodes MIN:MAX.
  ElasticSupervisor(const ElasticLaunch& options, int world_size, int ranks_per_node,
                    std::shared_ptr<comm::Rendezvous> store);
  ~ElasticSupervisor();

  // A rank failed (`how`: "signal 9 (Killed)"): the coordinator hears of it now; true when it should be
  // restarted (the budget allows), false when the job goes on without it.
  bool on_failure(int rank, pid_t pid, const std::string& how);
  // Processes (rank, pid) the coordinator excluded since the last call (to be ended with SIGKILL).
  std::vector<std::pair<int, int>> take_exclusions();
  int restarts() const { return restarts_; }

 private:
  ElasticLaunch options_;
  std::unique_ptr<elastic::Coordinator> coordinator_;
  std::mutex mu_;
  std::vector<std::pair<int, int>> excluded_;
  int restarts_ = 0;
};

}  // namespace crosstrain::apps
