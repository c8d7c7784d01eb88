// An executor that runs nothing: each started job advances one step every predicted step time of its placement on
// a simulated clock, checkpoints every checkpoint_every steps and is done after its steps. It checks the gang
// contract from the outside: every start must cover the job's ranks on clusters that are up and have room; a
// start that would not is counted (partial_gangs, overcommits) and refused. For tests and the benchmark.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "crosstrain/scheduler/scheduler.h"

namespace crosstrain::scheduler {

class SimulatedExecutor : public Executor {
 public:
  // Devices per cluster, to detect overcommitment.
  explicit SimulatedExecutor(std::map<std::string, int> capacity = {}) : capacity_(std::move(capacity)) {}
  static SimulatedExecutor for_registry(const Registry& registry);

  void start(const JobRecord& job, const PlacementRecord& placement) override;
  void stop(int64_t job_id) override;
  ExecStatus status(int64_t job_id) override;
  std::vector<std::string> lost_clusters() override { return {lost_.begin(), lost_.end()}; }
  // Live shrink and grow, when allowed (allow_share_changes): a share leaves and comes back while the rest of the
  // job goes on at its pace (no step is repeated).
  bool changes_shares() const override { return share_changes_; }
  void stop_share(int64_t job_id, size_t share) override;
  void start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) override;
  void allow_share_changes(bool on) { share_changes_ = on; }
  // Each cluster keeps its own run folder (--site-storage): share 0 stays out once the standby holds the store.
  bool has_sites(int64_t) const override { return sites_; }
  bool own_address(const std::string&) const override { return !one_address_; }
  void share_one_address(bool on) { one_address_ = on; }
  void use_sites(bool on) { sites_ = on; }

  double now() const { return now_; }
  void advance(double seconds) { now_ += seconds; }
  void lose(const std::string& cluster) { lost_.insert(cluster); }
  void restore(const std::string& cluster) { lost_.erase(cluster); }
  // Makes the next start of this job throw (a flaky cluster), once.
  void fail_next_start(int64_t job_id) { fail_start_.insert(job_id); }
  // Makes the next start of a share of this job into the running job throw, once.
  void fail_next_share_start(int64_t job_id) { fail_share_start_.insert(job_id); }
  // Makes the job's gang fail at its next status (a rank crashed, a share was preempted), once; with `share`, that
  // share is named as the one that failed.
  void crash(int64_t job_id, int share = -1) { crash_[job_id] = share; }

  int used(const std::string& cluster) const;  // ranks running there
  bool running(int64_t job_id) const { return jobs_.count(job_id) > 0; }
  int64_t partial_gangs() const { return partial_gangs_; }   // starts that did not cover the job's ranks
  int64_t overcommits() const { return overcommits_; }       // starts beyond a cluster's devices or on a lost one
  int64_t starts() const { return starts_; }
  int64_t share_starts() const { return share_starts_; }  // shares started again into running jobs

 private:
  struct Run {
    PlacementRecord placement;
    double started_s = 0;
    int64_t first_step = 0, steps = 0, checkpoint_every = 1;
  };
  std::map<std::string, int> capacity_;
  std::map<std::string, int> used_;
  std::map<int64_t, Run> jobs_;
  std::set<std::string> lost_;
  std::set<int64_t> fail_start_, fail_share_start_;
  std::map<int64_t, int> crash_;  // job -> the share named as failed (-1: none)
  double now_ = 0;
  bool share_changes_ = false, sites_ = false, one_address_ = false;
  int64_t partial_gangs_ = 0, overcommits_ = 0, starts_ = 0, share_starts_ = 0;
};

}  // namespace crosstrain::scheduler
