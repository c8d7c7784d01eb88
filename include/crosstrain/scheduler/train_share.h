// What one cluster's share of a recipe job runs, and what an executor reads back from the job's run folder.
// Pure (no libtorch): command lines and file names only, so every executor (Slurm, local processes) builds the
// same command and the rules are unit-tested.
//
// A share is one launcher node of the job: `crosstrain run --nproc R --nnodes S --node-rank K --master H:P
// --cluster K -- crosstrain train RECIPE --set ...`. Share 0's node hosts the rendezvous store; the shares of a
// gang meet there whichever cluster they run on. The scheduler's decisions become --set overrides (run folder,
// steps, checkpoints, then tp, pp, ZeRO and the sync across clusters through the planner's own bridge,
// planner::Layout::train_overrides); the user's own `set` entries come last and win. --resume is added when the run folder holds a checkpoint, so a re-placed job continues from it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "crosstrain/scheduler/job.h"

namespace crosstrain::scheduler {

struct TrainLaunch {
  std::string crosstrain = "crosstrain";  // the binary the ranks run
  std::string run_dir;                    // the share's run folder (every share's, on a shared file system)
  // Each cluster has storage of its own, shared with no other (issue 35): a share's run folder is its cluster's
  // (site_run_dir) and run.site names it, so every checkpoint is committed whole at every site of the job.
  bool sites = false;
  std::string site;                       // sites: this share's cluster
  std::string master_host = "127.0.0.1";  // where share 0's node is reached
  // Where each cluster's share node is reached, by cluster name: the job's rendezvous is on share 0's cluster, so a
  // share reaches it at that cluster's address (master_host when the cluster is not named here).
  std::map<std::string, std::string> cluster_hosts;
  int master_port = 0;                    // the job's rendezvous port, the same for every share
  int standby_port = 0;                   // its standby store's (PlacementRecord::standby_possible), on share 1's node
  int rendezvous_timeout_s = 300;         // shares may wait in their clusters' queues before they meet
  bool resume = false;                    // the run folder holds a checkpoint
  // The ledger of contributed compute (ledger.h): when set, the ranks keep a work log (run.work_log) and each
  // share signs its cluster's steps into the ledger with its key LEDGER_KEYS/CLUSTER.key, every claim_every_s
  // while it trains and once at its end (crosstrain ledger claim).
  std::string ledger, ledger_keys;
  // Where the shares reach the ledger instead of its file: the scheduler's URL (http[s]://ADDRESS:PORT, POST
  // /api/ledger), for clusters that do not share the scheduler's disk; "" : they append to `ledger` themselves.
  std::string ledger_url;
  std::string ledger_ca;  // with an https ledger_url: the certificate the shares trust (a path on the clusters)
  int claim_every_s = 30;
  int rank_restarts = 2;  // a live-elastic job's launchers restart a share's failed ranks this often themselves
  // The devices of one node of each cluster (ClusterInfo::devices_per_host), by name: a share with more ranks runs
  // over several nodes of its cluster, a launcher on each (started by srun inside the share's allocation). A cluster
  // not named here holds every share on one node.
  std::map<std::string, int> devices_per_node;
};

// The recipe a share trains from: the submitted text's copy in its run folder (RUN_DIR/recipe/NAME, written by its
// script), or the recipe's own path for specs without the text.
std::string share_recipe_path(const JobRecord& job, const TrainLaunch& launch);

// Pure: how many ranks each node of a share of `ranks` takes, nodes of `per_node` devices filled in turn (the last
// may hold fewer); one node when per_node <= 0 or the share fits one.
std::vector<int> share_node_sizes(int ranks, int per_node);

// The share's whole command: the launcher line, and with a ledger the periodic and final claims around it. The
// share's exit status is the launcher's.
std::string train_share_script(const JobRecord& job, const PlacementRecord& placement, size_t share,
                               const TrainLaunch& launch);

// Shell text that sets k, the node's place in share 0 of several nodes: 0 on the node whose Slurm NodeAddr is
// `rendezvous` (where the job's store listens), the others in Slurm's order; exits 2 naming the address when no
// node of the job has it.
std::string share_node_number(const std::string& rendezvous);

// The launcher line of one node of the share (`node`: its index among the share's nodes; kNodeFromSlurm: the
// node srun starts it on, from SLURM_NODEID, for the script to fill in). Every node of every share is a launcher
// node of its own size (--node-sizes); shares over several nodes are numbered on from the nodes before them.
constexpr int kNodeFromSlurm = -1;
std::vector<std::string> train_share_argv(const JobRecord& job, const PlacementRecord& placement, size_t share,
                                          const TrainLaunch& launch, int node = 0);
// The argv as one shell-quoted line.
std::string shell_line(const std::vector<std::string>& argv);

// The newest complete checkpoint's step in RUN_DIR/checkpoints (step_NNNNNNNN folders without a dot; a ".tmp"
// one is still being written), 0 when there is none.
int64_t newest_checkpoint_step(const std::string& run_dir);
// The step of the last complete line of RUN_DIR/metrics.jsonl, 0 when there is none.
int64_t last_metrics_step(const std::string& run_dir);

// A free TCP port on this machine for a job's rendezvous (bound and released; the launcher binds it next).
int free_port();

}  // namespace crosstrain::scheduler

namespace crosstrain::scheduler {

// The fencing token of a placement (run.fence, checkpoint/distributed.h): "job7.a2" for job 7's second placement.
std::string placement_fence(const JobRecord& job, const PlacementRecord& placement);

// K of a share's file stem "shareK" in a job's folder; -1 for any other name.
int share_number(const std::string& stem);

// Where an executor keeps a job: WORK_DIR/jobID holds each share's script, output and exit status
// (shareK.sh, shareK.out, shareK.exit); WORK_DIR/jobID/run is the job's run folder, kept across re-placements.
std::string job_dir_in(const std::string& work_dir, int64_t job_id);
// The run folder where the job's outputs are read (metrics, checkpoints): WORK_DIR/jobID/run, or with sites the
// folder of the placement's share 0 (its cluster's site_run_dir, recorded in WORK_DIR/jobID/run_dir).
std::string job_run_dir(const std::string& work_dir, int64_t job_id);
// With sites: WORK_DIR/sites/CLUSTER/jobID/run, the cluster's own storage (on one machine, a folder of its own).
std::string site_run_dir(const std::string& work_dir, const std::string& cluster, int64_t job_id);
// The cluster's own storage with sites: WORK_DIR/sites/CLUSTER (its jobs' run folders, its shares' output).
std::string site_dir_of(const std::string& work_dir, const std::string& cluster);

// Each placement of a job is its own computation in the ledger: a re-placed job repeats the steps after its
// checkpoint, and both placements did that work. The share's work log is work/CLUSTER.aATTEMPT.jsonl
// (CROSSTRAIN_WORK_LOG_NAME), and its claims are for job NAME-ID.aATTEMPT.
std::string work_log_name(const PlacementRecord& placement, size_t share);
// The scheduler's job id in a ledger job name ("tiny-7.a2" -> 7); -1 for a name the scheduler did not make.
int64_t job_of_ledger_job(const std::string& ledger_job);
std::string ledger_job(const JobRecord& job, const PlacementRecord& placement);

// The batch script of share `share`: the CROSSTRAIN_* variables (slurm_executor.h), the command, then, when
// `exit_stem` is given, its exit status into EXIT_STEM.exit (written to a temporary name and renamed, so a reader
// never sees half of it). Without one the script exits with the command's status: Slurm reports it (ExitCode),
// and nothing of the script writes into the scheduler's folder, which a cluster's nodes need not reach.
std::string share_script(const JobRecord& job, const PlacementRecord& placement, size_t share,
                         const std::string& command, const std::string& exit_stem);

// WORK_DIR/jobN/secret (mode 0600): 32 random bytes in hex, made when missing; returns its path.
std::string job_secret_file(const std::string& work_dir, int64_t job_id);
// The job's secret itself (job_secret_file's contents): the executors put it in each share's environment as
// CROSSTRAIN_SECRET (Slurm carries sbatch's environment to the job), so no node reads it from the scheduler's disk.
std::string job_secret(const std::string& work_dir, int64_t job_id);

// With sites, the job's outputs are read at one site's own storage: its outputs pointer, WORK_DIR/jobID/run_dir,
// exists.
bool job_has_sites(const std::string& work_dir, int64_t job_id);
// Share 0 was lost and the standby on share 1's node holds the job's store (Executor::store_moved): with sites rank
// 0 now writes at share 1's site, and the pointer moves there. Without sites nothing moves.
void outputs_follow_store(const std::string& work_dir, int64_t job_id, const PlacementRecord& placement);
// The rendezvous port and the standby's of the job's current placement: share 0 takes fresh ones (a placement
// always builds it first) and records them in WORK_DIR/jobID/rendezvous_port, where every other share reads them,
// also one started again into the running job later by a restarted daemon (and share 0 itself once the standby
// holds the store). The standby's reads 0 in a record from before standbys. Throws when nothing is recorded.
struct PlacementPorts {
  int rendezvous = 0, standby = 0;
};
PlacementPorts placement_ports(const std::string& work_dir, int64_t job_id, bool fresh);

// The usual ShareCommand for recipe jobs: train_share_argv with a fresh rendezvous port per placement
// (placement_ports), the run folder job_run_dir(work_dir, id), and --resume when it holds a checkpoint. Every job
// gets a secret of its own (job_secret, made on its first start), which the executor hands each share as
// CROSSTRAIN_SECRET, so only they join the job's store, and comm.encrypt seals what crosses clusters.
std::function<std::string(const JobRecord&, const PlacementRecord&, size_t)> train_share_command(TrainLaunch base,
                                                                                              std::string work_dir);

}  // namespace crosstrain::scheduler
