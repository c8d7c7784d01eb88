// What a user submits (a job and its QoS), what the scheduler decides for it (a placement) and what it records
// about it (state, attempts, newest checkpoint step). Plain data; pure (no libtorch).
//
//   JobSpec job{.name = "llama", .model = planner::model_preset("llama-7b"), .ranks = 64, .global_batch = 512,
//               .steps = 10000, .qos = {.deadline_s = 86400, .budget = 5000, .max_wan_gbps = 5}};
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/planner/layout.h"
#include "crosstrain/planner/model_shape.h"

namespace crosstrain::scheduler {

// Quality of service a job asks for. Zero or negative fields mean "no limit".
struct Qos {
  double deadline_s = 0;    // the run must end within this many seconds of submission (0: none)
  double budget = 0;        // most the whole run may cost, in the cluster file's price unit (0: none)
  // Most wide-area bandwidth the job may use on average, Gbit/s per cluster (< 0: no limit; 0: never span
  // clusters).
  double max_wan_gbps = -1;
};

// The range of JobSpec::priority.
constexpr int kMaxPriority = 1000;

struct JobSpec {
  std::string name = "job";
  // Who the job is for (quotas and accounting are per user) and how it ranks: a waiting job of higher priority is
  // placed first, and may preempt running jobs of lower priority (they save a checkpoint, stop and wait again).
  std::string user = "default";
  int priority = 0;  // -kMaxPriority .. kMaxPriority
  planner::ModelShape model;
  int ranks = 1;                  // devices wanted, all started together (a gang)
  // Elastic gang, as torchrun's --nnodes MIN:MAX: the job may start, or be re-placed after a loss, on as few as
  // this many ranks (the global batch stays the same, so it must divide it). 0: exactly `ranks`.
  int min_ranks = 0;
  int64_t global_batch = 0;       // sequences per step; 0: one per rank
  int64_t steps = 1000;           // training steps of the whole run
  int64_t checkpoint_every = 100;  // steps between checkpoints (where a re-placed job resumes)
  // A gang that fails (a rank crashed, a share was preempted or killed) is placed again from its newest checkpoint
  // up to this many times before the job fails, as torchrun's --max-restarts. A lost cluster does not count.
  int max_restarts = 0;
  Qos qos;
  // What the ranks run: a training recipe (crosstrain train RECIPE) and its --set overrides. Empty for jobs that
  // only exercise the scheduler (the simulation). The executor adds the placement's layout, sync mode and run folder.
  std::string recipe;
  // The recipe's text as it was submitted: each share writes it into its run folder at its site and trains from
  // that copy, so no node reads the submitter's disk. "" (specs from before): the ranks read `recipe` itself.
  std::string recipe_text;
  std::vector<std::string> overrides;  // "key=value", as `crosstrain train --set`

  int64_t batch() const { return global_batch > 0 ? global_batch : ranks; }
  int least_ranks() const { return min_ranks > 0 ? min_ranks : ranks; }
};

enum class JobState { Queued, Placed, Running, Failed, Done, Cancelled };
const char* to_string(JobState state);
JobState parse_job_state(const std::string& text);  // throws UsageError for an unknown name
// A job in one of these states holds devices.
inline bool holds_devices(JobState s) { return s == JobState::Placed || s == JobState::Running; }
inline bool finished(JobState s) { return s == JobState::Failed || s == JobState::Done || s == JobState::Cancelled; }

// The ranks of a job on one cluster and how they are laid out there.
struct ClusterShare {
  std::string cluster;
  int ranks = 0;
  std::string layout;  // inside this cluster: "dp=4 tp=2 pp=1"
  // The job goes on without this share (its cluster was lost, or its processes failed) and holds none of its
  // devices; it is started again into the running job once its cluster is up (Scheduler: live shrink and grow).
  bool absent = false;
  double started_s = -1;  // when this share last started (scheduler clock; -1: not known): in use since then
};

struct PlacementRecord {
  std::vector<ClusterShare> shares;  // every cluster of the gang (one or more)
  std::string layout;                // the whole job, as planner::Layout::describe() prints it
  planner::LayoutSync sync = planner::LayoutSync::Sync;  // across clusters (Sync on one cluster)
  int inner_steps = 1;               // diloco: steps between outer exchanges
  double step_s = 0;                 // predicted seconds per step (planner::estimate)
  double wan_gbps = 0;               // predicted wide-area use per cluster, Gbit/s
  double cost = 0;                   // predicted cost of the steps left
  int attempt = 0;                   // which placement of the job this is (1 = first)
  // Its launchers have a standby store on share 1's first node (crosstrain run --standby), decided when it was placed
  // (standby_possible): only such a placement may go on without share 0. Placements from before standbys have none.
  bool standby = false;
  // Share 0 was lost and the standby on share 1's first node holds the job's store now (crosstrain run --standby):
  // shares start against it, share 0 with --rejoin, unless it stays out (Executor::store_moved: sites).
  bool rendezvous_moved = false;
  bool share0_stays_out = false;

  int ranks() const;          // of every share, absent ones included (the job's full size)
  int present_ranks() const;  // of the shares that run now
  // Whether a share that runs now (not an absent one) is on `cluster`.
  bool on(const std::string& cluster) const;
  // The placement grows and shrinks at run time, one cluster share at a time, as elastic training across clusters
  // does: DiLoCo across two or more clusters, each cluster a whole unit of churn (elastic/membership.h).
  bool live_elastic() const;
  // A standby store on share 1's first node can take the job's store over when share 0 is lost: a live-elastic
  // placement of three shares or more (so that the others can be a majority) whose share 0 is one node (so that
  // node 1, which hosts the standby, is share 1's first).
  bool standby_possible(int share0_nodes) const;
};

struct JobRecord {
  int64_t id = 0;
  JobSpec spec;
  JobState state = JobState::Queued;
  int attempts = 0;          // placements made so far
  int restarts = 0;          // of them, after the gang failed (JobSpec::max_restarts)
  int64_t step = 0;          // newest checkpoint's step: where the next placement resumes
  std::string reason;        // why queued, failed or cancelled
  double submitted_s = 0;    // scheduler clock
  double updated_s = 0;
  std::optional<PlacementRecord> placement;  // while placed or running
};

}  // namespace crosstrain::scheduler
