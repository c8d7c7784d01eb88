// Orchestration: a gang scheduler over an executor. Jobs wait in a FIFO queue; each pass places them in order
// (a job that does not fit now lets later, smaller ones start: backfill), reserves every rank of a placement at
// once or none (Registry::reserve), records the decision in the state store in one transaction, then starts the
// whole gang on the executor. A cluster marked lost gives its jobs back: each is stopped everywhere, resumes from
// its newest checkpoint (JobRecord::step) and is placed again on the surviving clusters ahead of the queue.
//
//   StateStore store("state.db");
//   SimulatedExecutor exec;
//   Scheduler s(Registry::from_cluster_file(file), store, exec);
//   int64_t id = s.submit(spec);      // queued, or rejected at once when it can never run
//   s.tick();                         // poll the executor, place what fits, start it
//   s.mark_lost("west");              // re-place the jobs that ran there
// A Scheduler built on a store that already holds state recovers it: the registry's clusters, links and health
// come from the file, and every placed or running job's devices are reserved again.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "crosstrain/scheduler/job.h"
#include "crosstrain/scheduler/placement.h"
#include "crosstrain/scheduler/registry.h"
#include "crosstrain/scheduler/state_store.h"

namespace crosstrain::scheduler {

struct ExecStatus {
  enum Kind { Unknown, Running, Done, Failed } kind = Unknown;
  int64_t step = 0;             // steps done
  int64_t checkpoint_step = 0;  // newest complete checkpoint
  std::string detail;
  int failed_share = -1;        // Failed: the share that failed (its position in the placement), -1: not known
  // Failed: the executor could not start the job (or share `failed_share` of it, to grow); nothing of it runs.
  // An executor that starts in the background (ObservedExecutor) reports so here instead of throwing from start().
  bool start_failed = false;
};

// What runs the ranks: Slurm, local processes, or a simulation. start() must start every share or throw (and
// then have started nothing); the scheduler never calls it with a partial gang.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void start(const JobRecord& job, const PlacementRecord& placement) = 0;
  virtual void stop(int64_t job_id) = 0;
  virtual ExecStatus status(int64_t job_id) = 0;
  // Clusters the executor cannot reach or run on any more.
  virtual std::vector<std::string> lost_clusters() = 0;
  // The run folder of a job that trains a recipe (its metrics.jsonl, checkpoints/, report), "" when there is none
  // (a simulation). Read by the service for each job's live metrics and report.
  virtual std::string run_dir(int64_t /*job_id*/) const { return ""; }

  // Live shrink and grow (PlacementRecord::live_elastic): an executor that can end one share of a running job and
  // start one again into it says so here; otherwise the scheduler stops and re-places the whole gang instead.
  virtual bool changes_shares() const { return false; }
  // How many nodes a share of `ranks` on `cluster` runs on (the share's launcher nodes): 1 unless the executor splits
  // shares larger than a node (Slurm).
  virtual int share_nodes(const std::string& /*cluster*/, int /*ranks*/) const { return 1; }
  // Ends share `share` (its cluster may not answer: then only the record of it goes); status() no longer counts it.
  virtual void stop_share(int64_t /*job_id*/, size_t /*share*/) {}
  // Starts share `share` of the running job again (the others run on); throws when it cannot.
  virtual void start_share(const JobRecord& /*job*/, const PlacementRecord& /*placement*/, size_t /*share*/) {}
  // Share 0 was lost and the standby on share 1's node holds the job's store now (PlacementRecord::rendezvous_moved):
  // where each cluster keeps its own run folder, the job's outputs are read at share 1's site from now on.
  virtual void store_moved(const JobRecord& /*job*/, const PlacementRecord& /*placement*/) {}
  // Each cluster keeps the job's run folder on its own storage (--site-storage). Then share 0 does not come back
  // once the store moved: its rank 0, which writes the job's outputs, would write at share 0's site again, whose
  // metrics.jsonl lacks the rows trained meanwhile.
  virtual bool has_sites(int64_t /*job_id*/) const { return false; }
  // The executor starts shares on `cluster` at an address of its own (--cluster-host), where a standby store can
  // listen; otherwise every cluster is reached at one address and no standby is given.
  virtual bool own_address(const std::string& /*cluster*/) const { return true; }
};

struct SchedulerOptions {
  PlacementOptions placement;
  // Backfill behind a blocked head for at most this many passes; then the queue waits for the head (no starvation).
  int backfill_passes = 1000;
  // Most devices each user's jobs may hold at once (JobSpec::user); a user not named has no limit.
  std::map<std::string, int> quotas;
  // A waiting job that only jobs of lower priority keep out preempts them: each saves a checkpoint as it stops
  // (the trainer does on SIGTERM) and waits again, to resume from it.
  bool preemption = true;
  // A live-elastic job's share whose cluster has been down this long grows onto another cluster of the same device
  // with room (Scheduler::other_home), instead of waiting for its own to come back. Negative: never.
  double move_after_s = 30;
};

struct SchedulerStats {
  int64_t decisions = 0;            // placements made (each timed from the planner call to the commit)
  int64_t refusals = 0;             // queued jobs that did not fit on a pass
  int64_t rejected = 0;
  std::vector<double> decision_s;   // wall seconds of each placement made
};

class Scheduler {
 public:
  using Clock = std::function<double()>;  // seconds, for records and deadlines (the simulation passes its own)
  Scheduler(Registry registry, StateStore& store, Executor& executor, SchedulerOptions options = {}, Clock clock = {});

  // Queues a job (Queued), or records it Failed with the reason when it can never run. Returns its id.
  int64_t submit(const JobSpec& spec);
  // Stops a job wherever it is; false when it had already finished.
  bool cancel(int64_t id);
  // One pass: poll running jobs and cluster health, then place and start what fits. Returns placements made.
  int tick();
  // Takes a cluster out (lost, drained). A job whose training is elastic across clusters (live_elastic) goes on
  // without its share there, which comes back when the cluster does (shrink and grow live); any other job of the
  // cluster is stopped and resumes elsewhere from its newest checkpoint. Returns how many jobs it displaced.
  int mark_lost(const std::string& cluster);
  void mark_up(const std::string& cluster);
  // The resource layer's registration: a cluster announces itself with a planner cluster file holding it alone
  // (its device type, devices, links inside it). A new name joins the pool; a known one with the same spec comes
  // back up (a cluster that was lost and returns). Returns "added", "up" or "unchanged"; a known name with another
  // spec is a UsageError (take it out of the cluster file and restart the daemon to change a cluster).
  std::string register_cluster(const planner::ClusterFile& one);
  // A measured wide-area link between two registered clusters (crosstrain bench cost-model measures them).
  void set_link(const std::string& a, const std::string& b, const comm::Link& link);

  const JobRecord& job(int64_t id) const;  // throws UsageError for an unknown id
  bool has_job(int64_t id) const { return jobs_.count(id) > 0; }
  // Whether the clusters now up could hold the job if they were empty (false: it waits for a lost one to return).
  bool could_run(int64_t id) { return fits_up_clusters(mutable_job(id)); }
  std::vector<const JobRecord*> jobs() const;
  // The jobs running now (what an ObservedExecutor is asked to observe).
  std::vector<int64_t> running() const;
  // Changes whenever a cluster goes down, comes up or is added: an observation of the clusters made across a
  // change says nothing of the cluster that came back.
  int64_t up_epoch() const { return up_epoch_; }
  const Registry& registry() const { return registry_; }
  const Executor& executor() const { return executor_; }  // the service reads each job's run folder through it
  const SchedulerStats& stats() const { return stats_; }
  // Device-seconds by user and cluster: what jobs used up to their last release, and the shares running now so far.
  std::vector<StateStore::UsageRow> usage() const;
  size_t queued() const { return queue_.size(); }
  // Jobs holding devices, by id.
  std::vector<int64_t> active() const { return {active_.begin(), active_.end()}; }

 private:
  void recover();
  void persist_registry();
  bool try_place(JobRecord& job);
  bool fits_up_clusters(const JobRecord& job);  // on every device of the clusters now up (memoised per up-set)
  void start(JobRecord& job);
  void release(JobRecord& job);
  // Adds the share's device-seconds since it started to its user's usage on its cluster (a running share only).
  void account(const JobRecord& job, const ClusterShare& s);
  void poll();
  void requeue_unstarted(JobRecord& job, const std::string& why);
  void share_unstarted(JobRecord& job, size_t share, const std::string& why);
  void restart(JobRecord& job, const ExecStatus& failure);
  // Live shrink and grow: whether the job goes on without share `share` (an executor that can, a live_elastic
  // placement, and another share still running). Share 0 hosts the job's rendezvous and membership: only where a
  // standby on share 1's node takes them over (PlacementRecord::standby_possible, share 1 running, the others a
  // majority), once; then share 1 holds them.
  bool goes_on_without(const JobRecord& job, size_t share) const;
  void shrink(JobRecord& job, size_t share, const std::string& why);
  // Starts absent shares again on clusters that are up and have room (each tick): on their own cluster, or where it
  // is down on another one (other_home).
  void grow();
  // Where absent share `share` may grow instead of its own cluster, which is down: an up cluster of the same device
  // and devices per host that no share of the job names, with room for it (a cluster that registered meanwhile, or a free one). Not share
  // 0 (node 0: the job's store, or its way back in), nor share 1 while it holds the standby (the running launchers
  // know its address). "" : none.
  std::string other_home(const JobRecord& job, size_t share) const;
  int held_by(const std::string& user) const;  // devices the user's jobs hold now
  // Preempts jobs of lower priority than `head` when that lets it be placed; true when it did.
  bool preempt_for(const JobRecord& head);
  void preempt(JobRecord& victim, const JobRecord& head);
  void finish(JobRecord& job, JobState state, const std::string& reason);
  JobRecord& mutable_job(int64_t id);
  double now() const { return clock_(); }

  Registry registry_;
  StateStore& store_;
  Executor& executor_;
  SchedulerOptions options_;
  Clock clock_;
  LayoutCache cache_;
  std::map<int64_t, JobRecord> jobs_;
  std::vector<int64_t> queue_;   // waiting, in order (re-placed jobs at the front)
  std::set<int64_t> active_;     // placed or running
  int64_t blocked_head_ = 0;     // the first waiting job that the up clusters could hold
  int blocked_passes_ = 0;       // passes it has waited while later jobs backfilled
  int64_t up_epoch_ = 0;         // changes whenever a cluster goes down or comes up
  int64_t freed_ = 0;            // changes whenever devices are given back or a cluster comes up
  std::map<int64_t, int64_t> refused_at_;  // job -> freed_ when placement last refused it
  std::map<int64_t, std::pair<int64_t, bool>> fits_up_;  // job -> (up_epoch_, fits the up clusters)
  std::map<std::pair<int64_t, size_t>, double> grow_after_;  // (job, share) -> not started again before this time
  std::map<std::pair<int64_t, size_t>, double> down_since_;  // (job, absent share) -> since when its cluster is down
  SchedulerStats stats_;
};

}  // namespace crosstrain::scheduler
