// An executor whose slow calls are made without the scheduler's lock. The daemon's service holds one lock over the
// scheduler while it ticks and while it answers the API; asking Slurm whether a cluster and each job are alive
// (scontrol ping, squeue: up to the command timeout each, retried for a dead controller), and submitting or
// cancelling a job's shares (sbatch, scancel, one command per share), inside that lock kept every API request
// waiting. ObservedExecutor answers status() and lost_clusters() from its last observation, which the service's
// ticker makes (observe()) before it takes the lock; start, stop and the share changes are queued and made in
// order by a thread of its own, and forget what was observed of that job (an observation made before a job
// started again says nothing about the new start). While a job has an action queued or in progress its status is
// Unknown; a start that fails is reported once by status() as Failed with start_failed (the scheduler then queues
// the job again, or gives the share up for now) instead of being thrown from start(). The Kubernetes way:
// decisions on observed state, observed and acted on apart. The wrapped executor must answer status() and
// lost_clusters() on one thread while it acts on another (the Slurm executor does: its files are replaced whole,
// its set of unreachable clusters is guarded).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/scheduler/scheduler.h"

namespace crosstrain::scheduler {

class ObservedExecutor : public Executor {
 public:
  explicit ObservedExecutor(Executor& inner);
  // Makes the actions still queued (each bounded by the wrapped executor's own timeouts), then ends its thread.
  ~ObservedExecutor() override;
  ObservedExecutor(const ObservedExecutor&) = delete;
  ObservedExecutor& operator=(const ObservedExecutor&) = delete;

  // Asks the wrapped executor about the clusters and the jobs `running` (the scheduler's, read under its lock by
  // the caller); keeps the answers for status() and lost_clusters(). Call it without the scheduler's lock, from one
  // thread at a time (the service's ticker).
  void observe(const std::vector<int64_t>& running);
  // Forgets which clusters were seen lost (a cluster registered again while they were being asked: the next
  // observation asks again rather than have the scheduler mark it lost once more).
  void forget_lost();
  // Waits until every action queued so far is made; false if `timeout` passed first.
  bool settle(std::chrono::milliseconds timeout);

  void start(const JobRecord& job, const PlacementRecord& placement) override;
  void stop(int64_t job_id) override;
  // The last observation of the job (kind Unknown before the first, or after the job was started or stopped since:
  // its newest checkpoint and step stay known).
  ExecStatus status(int64_t job_id) override;
  std::vector<std::string> lost_clusters() override;
  std::string run_dir(int64_t job_id) const override { return inner_.run_dir(job_id); }
  bool changes_shares() const override { return inner_.changes_shares(); }
  int share_nodes(const std::string& cluster, int ranks) const override { return inner_.share_nodes(cluster, ranks); }
  void stop_share(int64_t job_id, size_t share) override;
  void start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) override;
  // A file written at once (no command): not queued.
  void store_moved(const JobRecord& job, const PlacementRecord& placement) override {
    inner_.store_moved(job, placement);
  }
  bool has_sites(int64_t job_id) const override { return inner_.has_sites(job_id); }
  bool own_address(const std::string& cluster) const override { return inner_.own_address(cluster); }

 private:
  struct Action {
    enum Kind { Start, Stop, StopShare, StartShare } kind;
    JobRecord job;  // Start, StartShare
    PlacementRecord placement;
    int64_t job_id = 0;
    size_t share = 0;
  };
  void queue(Action action);
  void act_loop();
  std::optional<ExecStatus> act(const Action& a);
  void forget_locked(int64_t job_id);  // the job changed: what was seen of it no longer holds


  Executor& inner_;
  mutable std::mutex seen_mutex_;
  std::map<int64_t, ExecStatus> seen_;
  std::map<int64_t, uint64_t> changes_;  // per job: bumped by every start or stop, so a stale answer is dropped
  std::vector<std::string> lost_;
  std::deque<Action> actions_;
  std::map<int64_t, int> acting_;               // per job: actions queued or in progress
  std::map<int64_t, ExecStatus> failed_starts_;  // reported once each
  std::condition_variable acted_;
  bool closing_ = false;
  std::thread actor_;
};

}  // namespace crosstrain::scheduler
