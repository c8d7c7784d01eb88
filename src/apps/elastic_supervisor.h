// The launcher's part in elastic training: on node 0 it runs the membership coordinator beside the rendezvous
// store; on every node it restarts failed ranks (--max-restarts, all ranks together) and ends the ranks that the
// coordinator excluded alive (a hung rank, the rest of a failed replica) so that they restart too. Launchers of
// other nodes hear of exclusions and report their ranks' exits through the store (a light connection polled on a
// thread), so a rank that dies on any node is detected in milliseconds, not after the failure timeout.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/elastic/coordinator.h"

namespace crosstrain::apps {

struct ElasticLaunch {
  bool enabled = false;
  int max_restarts = 0;  // restarts of failed ranks, all ranks of this node together
  int min_nnodes = 0;    // --nnodes MIN:MAX: the job starts once MIN nodes' ranks are there; 0: every node
};

// The standby (crosstrain run --standby): where it listens, and on node 1 the store itself.
struct Standby {
  std::string host;
  int port = 0;
  std::shared_ptr<comm::Rendezvous> store;  // node 1 only
};

// Where a launcher without the store finds it.
struct StoreAddress {
  std::string host;
  int port = 0;
  comm::JobCredentials job;
  std::vector<int> ranks;  // this node's ranks
};

// Whether the store at `at` answers within a second; `took_over`: and holds a standby's generations.
bool store_answers(const StoreAddress& at, int world_size, bool took_over);

class ElasticSupervisor {
 public:
  // `store`: the rendezvous store this launcher hosts (node 0), or null: then it connects to `remote`.
  // `min_start_ranks`: the ranks of --nnodes MIN:MAX's MIN nodes (the fewest that may start the job).
  // `standby`: node 1 hosts its store and starts a coordinator there once node 0's store has been unreachable for
  // kTakeoverAfter; the other nodes then report to it. On node 0 it says only that a standby exists: its
  // coordinator then publishes a failure generation only with a quorum (CoordinatorOptions::quorum).
  ElasticSupervisor(const ElasticLaunch& options, int world_size, int min_start_ranks,
                    std::shared_ptr<comm::Rendezvous> store, StoreAddress remote = {}, Standby standby = {});
  ~ElasticSupervisor();

  // A rank failed (`how`: "signal 9 (Killed)"): the coordinator hears of it now; true when it should be
  // restarted (the budget allows), false when the job goes on without it.
  bool on_failure(int rank, pid_t pid, const std::string& how);
  // Processes (rank, pid) the coordinator excluded since the last call (to be ended with SIGKILL).
  std::vector<std::pair<int, int>> take_exclusions();
  // Where a restarted rank finds the job's store once the standby took over (host, port); nullopt before.
  std::optional<std::pair<std::string, int>> store_for_restarts();
  int restarts() const { return restarts_; }

 private:
  // Other nodes: the thread that reports exits and hears of exclusions through the store.
  void link_loop();
  void link_once(c10d::Store& store);
  // The primary is lost: node 1 starts its coordinator on the standby store; other nodes report there.
  bool try_standby();
  bool standby_started();  // the standby's coordinator published its first generation
  elastic::CoordinatorOptions coordinator_options(bool takeover);
  // How long node 0's store stays unreachable before the standby's turn: longer than a loaded machine's pause.
  static constexpr std::chrono::milliseconds kTakeoverAfter{2000};

  ElasticLaunch options_;
  int world_size_;
  int min_start_ranks_;
  // Node 0's, or node 1's standby once node 0 stopped answering (set by the link thread, under mu_).
  std::unique_ptr<elastic::Coordinator> coordinator_;
  std::mutex mu_;
  std::vector<std::pair<int, int>> excluded_;
  std::vector<std::pair<int, int>> exits_to_report_;  // (rank, pid), under mu_
  int restarts_ = 0;
  StoreAddress remote_;
  Standby standby_;
  int64_t exclusions_seen_ = 0;
  std::map<int, int> excluded_pid_;  // rank -> the newest pid the coordinator excluded (handled once)
  std::atomic<bool> stop_{false};
  bool reached_ = false;
  int64_t looks_ = 0;                  // link_once calls (the finished key is read every 25th)
  std::atomic<bool> finished_{false};  // the store said training finished: no more restarts
  bool standby_took_over_ = false;  // other nodes: they report to the standby now (under mu_)  // the link thread reached the store it reports to (a store never reached is not lost)
  std::thread link_;
};

}  // namespace crosstrain::apps
