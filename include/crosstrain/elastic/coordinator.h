// The membership coordinator of an elastic job: runs beside the rendezvous store (in the launcher of node 0),
// watches every rank's heartbeat counter and registration, and publishes each new generation (membership_logic.h
// has the rules). It never trains and holds no model state, so it survives any rank's failure. With a standby
// (crosstrain run --standby), a second one starts beside the standby store once node 0 is lost (`takeover`): it
// knows nothing of the old one's generations, and starts from the registrations of the ranks that came over.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/elastic/membership_logic.h"

namespace c10d {
class Store;
}

namespace crosstrain::elastic {

struct CoordinatorOptions {
  int world_size = 1;
  // The first generation starts with every rank, or with min_replicas once this long has passed since the first
  // registration (nodes that join later: --nnodes MIN:MAX).
  std::chrono::milliseconds settle{3000};
  int min_start_ranks = 0;  // the first generation needs at least this many ranks (--nnodes MIN:MAX)
  // Processes that left the job alive (a hung rank, or the rest of a failed replica), as (rank, pid): the launcher
  // ends them so that they can be restarted. Called on the coordinator's thread; a process whose exit the launcher
  // already reported is not listed.
  std::function<void(const std::vector<std::pair<int, int>>& processes, const std::string& why)> exclude;
  // One line per event ("generation 3 (failure): ..."), prefixed by the caller.
  std::function<void(const std::string& line)> log;
  // A standby's coordinator, started after the primary was lost: its first generation ("takeover") is numbered
  // above every generation the registrants knew and waits for a majority of the last members (takeover_quorum).
  bool takeover = false;
  // A standby exists (crosstrain run --standby on the primary's node): a failure generation needs the ranks alive
  // here to hold half of every generation of the quorum window (primary_keeps_quorum), so that a cut-off primary
  // never trains on beside the standby's majority.
  bool quorum = false;
};

class Coordinator {
 public:
  Coordinator(c10::intrusive_ptr<c10d::Store> store, CoordinatorOptions options);
  ~Coordinator();  // stops the thread
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // This launcher reaped the process of `rank`: it is dead now (no need to wait for its heartbeat to stop).
  // Launchers of other nodes report through the store (exited_key); excluded processes are published there too
  // (exclude_key) for the launcher that runs them, beside the `exclude` callback for this one.
  void rank_exited(int rank);
  // The newest generation published (0: none yet).
  int64_t generation() const { return published_.load(); }

 private:
  void loop();
  void tick(Clock::time_point now);
  void read_registrations();
  void observe_heartbeats(Clock::time_point now);
  // Exits that launchers on other nodes reported through the store since the last look: (rank, pid).
  std::vector<std::pair<int, int>> reported_exits();
  // Members' accusations (membership_logic.h, Accusation) since the last look: the accused count as dead.
  void read_accusations();
  bool is_accused(int rank, const std::string& incarnation) const;
  // `holders`: the generation whose members hold the live state (MembershipView::holders), or null.
  void publish(const Generation& next, Clock::time_point now, const Generation* holders);
  bool waits_to_join(int rank, const std::string& member, const Generation* holders, Clock::time_point now) const;
  void close_generation(const Generation& g, int64_t successor);
  void decide_committed(int64_t generation, int64_t step, int64_t successor);
  int64_t start_step(int64_t id) const;
  void refresh_window();
  bool keeps_quorum(const Generation& next, const MembershipView& view);
  std::string describe_losses(const Generation& next, Clock::time_point now, const Generation* holders) const;

  c10::intrusive_ptr<c10d::Store> store_;
  CoordinatorOptions options_;
  FailureDetector detector_;
  Timing timing_;
  std::map<int, Registration> registered_;
  std::vector<Generation> open_;  // generations whose members may still vote (the newest last)
  std::set<int64_t> closed_;
  Clock::time_point first_registration_{};
  std::vector<WindowGeneration> window_;  // with a standby: what a failure must keep half of (refresh_window)
  std::set<std::pair<int, int>> exited_pids_;  // (rank, pid) of every exit the launchers reported here
  std::string no_quorum_said_;   // the last no-quorum line logged (said once, not every tick)
  Clock::time_point emptied_{};  // when a generation without replicas was published
  std::mutex exited_mu_;
  std::condition_variable wake_;  // a reaped rank (rank_exited) or the end: the next tick is now
  std::vector<int> exited_;
  int64_t roster_seen_ = -1;  // the roster_key() counter at the last look
  int64_t exits_seen_ = 0;  // the exits_key() counter at the last look
  int64_t accusations_seen_ = 0;  // the accusations_key() counter at the last look
  struct Accused {
    std::string incarnation;
    int accuser = -1;
    std::string why;
  };
  std::map<int, Accused> accused_;  // by rank: processes excluded on another member's evidence
  std::atomic<int64_t> published_{0};
  bool finishing_ = false;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace crosstrain::elastic
