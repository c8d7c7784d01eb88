// Runs a job's gang on real Slurm clusters through their own commands (sbatch, squeue, scancel, scontrol), one
// batch job per cluster share. Each cluster is reached through its SLURM_CONF, so one scheduler drives several
// clusters (scripts/slurm_testbed.sh starts small ones on one machine).
//
// A share runs on as many nodes as its ranks need (SlurmCluster::devices_per_node): one task per node with that
// many CPUs (or GPUs, --gres); a share that fits one node gets --ntasks of its ranks there (share_resources).
//
// start() submits every share; if any submission fails it cancels the shares already submitted and throws, so
// a gang never runs in part. Nothing a share's nodes run reads or writes the scheduler's folder (a cluster need not
// reach its disk): the job's secret goes in sbatch's environment, the share's output to the cluster's own folder
// (SlurmCluster::site_dir), and how it ended comes from Slurm (scontrol show job: JobState, ExitCode), which the
// executor keeps in the job's folder once seen, so status() knows it after Slurm forgot the job. A new executor
// on the same folder finds its jobs again.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/scheduler/scheduler.h"

namespace crosstrain::scheduler {

struct SlurmCluster {
  std::string name;       // the registry's cluster name
  std::string conf;       // its slurm.conf (SLURM_CONF for every command)
  std::string partition;  // "" : the default partition
  // Devices (CPUs in the tests) of one of its nodes: a share with more ranks gets several nodes, one launcher on
  // each (train_share_script starts them with srun). 0: every share on one node.
  int devices_per_node = 0;
  // The cluster's own folder, on its own storage, for its shares' output (SITE_DIR/jobID-shareK-SLURMID.out; Slurm
  // does not make folders, so it must exist); "" : the job's folder in the scheduler's work folder.
  std::string site_dir;
  // Where a job's rendezvous is reached when this cluster holds its share 0 (--cluster-host): a share 0 of several
  // nodes asks Slurm for the node at that address (--nodelist), which becomes its node 0. "" : any nodes.
  std::string rendezvous_addr;
  // Its devices are GPUs (Slurm's gres "gpu"), not CPUs: a share asks each node for --gres=gpu:N, N the ranks of
  // its fullest node, beside its tasks.
  bool gpus = false;
};

// What a share of `ranks` asks Slurm for: its nodes (share_node_sizes), its tasks (all its ranks on one node, or one
// launcher a node), and its devices: CPUs a task over several nodes, or GPUs as gres on a GPU cluster.
std::vector<std::string> share_resources(const SlurmCluster& c, int ranks);
// The name of the node whose NodeAddr is `addr` in `scontrol show node -o` output; "" when none is.
std::string node_at_address(const std::string& scontrol_nodes, const std::string& addr);

// What `scontrol show job -o ID` says of a job: its state and, once it ended, its batch script's exit status or
// the signal that ended it. nullopt for text without a JobState.
struct SlurmJobState {
  std::string state;  // PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...; "" : Slurm no longer knows the job
  int exit_code = 0, signal = 0;
  bool ended() const;  // a terminal state (or forgotten)
  // "" for a clean end (COMPLETED, exit 0); else how it ended, for messages ("exited with 3 (Slurm: FAILED)").
  std::string failure() const;
};
std::optional<SlurmJobState> parse_scontrol_job(const std::string& text);
// The same from Slurm's accounting (`sacct -j ID -X -n -P -o State,ExitCode`), once the controller forgot the job.
std::optional<SlurmJobState> parse_sacct_job(const std::string& text);

// What share `share` of a placed job runs (a shell command line; Slurm starts it once, on the share's first node,
// with the share's tasks allocated). The environment adds CROSSTRAIN_JOB_ID, CROSSTRAIN_CLUSTER_NAME,
// CROSSTRAIN_SHARE, CROSSTRAIN_SHARES, CROSSTRAIN_RANK_OFFSET (the share's first global rank) and
// CROSSTRAIN_WORLD_SIZE.
using ShareCommand = std::function<std::string(const JobRecord& job, const PlacementRecord& placement, size_t share)>;

class SlurmExecutor : public Executor {
 public:
  SlurmExecutor(std::vector<SlurmCluster> clusters, std::string work_dir, ShareCommand command,
                std::chrono::milliseconds command_timeout = std::chrono::milliseconds(10000));
  ~SlurmExecutor() override;
  SlurmExecutor(const SlurmExecutor&) = delete;
  SlurmExecutor& operator=(const SlurmExecutor&) = delete;
  void start(const JobRecord& job, const PlacementRecord& placement) override;
  // scancel every share and return; a thread of the executor's watches them until the clusters that answer no
  // longer list them, and sends SIGKILL to those still listed after half the grace (20 s). A job started again
  // meanwhile cannot meet them: its shares are other Slurm jobs, and its placement's fence (run.fence) keeps the
  // old ranks from committing a checkpoint.
  void stop(int64_t job_id) override;
  void set_stop_grace(std::chrono::milliseconds grace) { stop_grace_ = grace; }
  // Shares stop() cancelled that a cluster still lists (the reaper's watch list).
  size_t stopping() const;
  ExecStatus status(int64_t job_id) override;
  std::vector<std::string> lost_clusters() override;
  std::string run_dir(int64_t job_id) const override;  // WORK_DIR/jobID/run (train_share.h)
  bool changes_shares() const override { return true; }
  int share_nodes(const std::string& cluster, int ranks) const override;
  // scancel the share when its cluster answers; its files are kept aside (*.gone).
  void stop_share(int64_t job_id, size_t share) override;
  void start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) override;
  // The job's outputs are read where rank 0 now writes them (outputs_follow_store).
  void store_moved(const JobRecord& job, const PlacementRecord& placement) override;
  bool has_sites(int64_t job_id) const override;
  bool own_address(const std::string& cluster) const override;  // its --cluster-host

  // The Slurm job id of each share (cluster name -> id), from memory or the job's folder.
  std::map<std::string, std::string> slurm_ids(int64_t job_id) const;
  std::string job_dir(int64_t job_id) const;

 private:
  const SlurmCluster& cluster(const std::string& name) const;
  std::string submit(const JobRecord& job, const PlacementRecord& placement, size_t share);
  // Slurm's name of the node at c.rendezvous_addr; throws naming the address when there is none.
  std::string rendezvous_node(const SlurmCluster& c, int64_t job_id, size_t share) const;
  // Slurm's view of a share (state "" once Slurm no longer knows it; nullopt when the cluster does not answer).
  std::optional<SlurmJobState> slurm_job(const SlurmCluster& c, const std::string& id);
  // The stem (WORK_DIR/jobID/shareK) of the share that is Slurm job `id` on `cluster`, or "".
  std::string share_stem(int64_t job_id, const std::string& cluster, const std::string& id) const;

  std::vector<SlurmCluster> clusters_;
  std::string work_dir_;
  ShareCommand command_;
  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds stop_grace_{20000};  // stop(): how long to watch cancelled shares before giving up
  bool reachable(const std::string& cluster) const;

  // Cancelled shares, watched by reap_loop() until they end.
  struct Stopping {
    std::string conf, id;
    std::chrono::steady_clock::time_point since;
    bool killed = false;
  };
  void reap_loop();
  bool reap_once(Stopping& s) const;  // true once the share is gone (or given up on)

  mutable std::mutex mutex_;           // guards unreachable_ and stopping_: status() runs beside start() and stop()
  std::set<std::string> unreachable_;  // clusters whose controller missed the last ping
  std::vector<Stopping> stopping_;
  bool closing_ = false;
  std::condition_variable wake_;
  std::thread reaper_;
};

}  // namespace crosstrain::scheduler
