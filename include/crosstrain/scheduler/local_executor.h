// Runs a job's gang as processes on this machine: each cluster share's batch script (train_share.h) in a process
// group of its own, its output in the job's folder. For one machine (a workstation, a single node, the tests);
// Slurm clusters: slurm_executor.h. The same folder layout as the Slurm executor, so status() knows how a share
// ended from its exit file after the daemon restarted, and stop() reaches shares started by an earlier daemon
// through their recorded process groups.
#pragma once

#include <chrono>
#include <string>

#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/slurm_executor.h"

namespace crosstrain::scheduler {

class LocalExecutor : public Executor {
 public:
  // `max_ranks`: the most ranks one job may start here (0: two per core of this machine, the most a CPU host
  // trains with): a placement of 4,096 ranks on a workstation is refused, not spawned.
  LocalExecutor(std::string work_dir, ShareCommand command,
                std::chrono::milliseconds stop_grace = std::chrono::milliseconds(10000), int max_ranks = 0);
  void start(const JobRecord& job, const PlacementRecord& placement) override;
  // SIGTERM to every share's process group (the launcher stops its ranks), SIGKILL after the grace period.
  void stop(int64_t job_id) override;
  ExecStatus status(int64_t job_id) override;
  std::vector<std::string> lost_clusters() override { return {}; }  // one machine: it is up while we run
  std::string run_dir(int64_t job_id) const override;
  bool changes_shares() const override { return true; }
  // SIGTERM to the share's process group, SIGKILL after the grace period; its files are kept aside (*.gone).
  void stop_share(int64_t job_id, size_t share) override;
  void start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) override;
  // The job's outputs are read where rank 0 now writes them (outputs_follow_store).
  void store_moved(const JobRecord& job, const PlacementRecord& placement) override;
  bool has_sites(int64_t job_id) const override;

 private:
  // `secret` reaches the share as CROSSTRAIN_SECRET (job_secret).
  int spawn(const std::string& script, const std::string& out, const std::string& secret) const;
  void spawn_share(const std::string& stem, int64_t job_id) const;
  void launch_share(const JobRecord& job, const PlacementRecord& placement, size_t share);
  void end_group(pid_t pgid) const;

  std::string work_dir_;
  ShareCommand command_;
  std::chrono::milliseconds grace_;
  int max_ranks_;
};

}  // namespace crosstrain::scheduler
