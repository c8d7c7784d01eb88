// How data-parallel replicas stay in agreement, across clusters joined by slow links (`sync.mode`):
//
//   sync     every step: the gradient all-reduce over all replicas (the data-parallel reducer); hierarchical:
//            the reducer runs inside each cluster and one cross-cluster average of the gradients follows
//   diloco   the reducer runs inside each cluster; every H inner steps the pseudo-gradient (parameters at the last
//            outer step minus now) is averaged across clusters (optionally compressed, with error feedback) and
//            an outer SGD step with Nesterov momentum moves every replica to the same new parameters. Streaming
//            (fragments > 1): parameter fragments sync on a staggered schedule, each exchange overlapping
//            `overlap_steps` inner steps
//   ssp      no per-step all-reduce: every rank is a worker of the sharded parameter server and may run at most
//            `staleness` steps ahead of the slowest worker
//   async    the same parameter server without a bound: push, pull, never wait for the others
//   gossip   no per-step all-reduce: every `period` steps each rank averages its parameters with one neighbour
//            (pairs change each round); no global barrier
//
// The cluster of each rank comes from `sync.clusters` (consecutive blocks of data-parallel ranks) or from the
// environment of its node (CROSSTRAIN_CLUSTER, or CT_CLUSTER as set by scripts/testbed). Only the strategy's own
// exchanges cross clusters; heavy per-step traffic stays in the cluster.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/optimizer.h"

namespace crosstrain::train {

// Cluster of each data-parallel rank -> groups (cluster_layout() below). Clusters are renumbered in order of
// first appearance.
struct ClusterLayout {
  int clusters = 1;
  std::vector<int> cluster_of;               // per data-parallel rank
  std::vector<std::vector<int>> local;        // per cluster: its data-parallel ranks, ascending
  std::vector<std::vector<int>> cross;        // per local index: the rank of that index in each cluster
  bool balanced = true;                       // every cluster has the same number of ranks
};

struct SyncStats {
  int64_t wan_bytes = 0;      // bytes this rank sent to other clusters for synchronization (cumulative)
  double blocked_s = 0;       // time the training loop waited inside the strategy (cumulative)
  int64_t exchanges = 0;      // outer steps, fragment syncs, gossip rounds or pushes
  double staleness_mean = 0;  // async, ssp: updates of other workers applied between a pull and the next push
  int64_t staleness_max = 0;
};

// The tensors a strategy keeps in agreement are this rank's part of the model state: its parameter shards (the
// same (pp, tp) coordinate in every replica holds the same shard, so each rank exchanges only its own), or with
// ZeRO the master slices it owns. Built in two steps: the groups first (the optimizer's gradient reduction runs
// over gradient_group()), then attach() the optimizer's tensors, load a checkpoint, and start().
class SyncStrategy {
 public:
  virtual ~SyncStrategy() = default;
  virtual std::string describe() const = 0;
  // The group of the per-step gradient all-reduce (null: none; every rank steps alone).
  virtual comm::Communicator* gradient_group() const = 0;
  // The cluster of this rank (0 with one cluster), and of every data-parallel rank.
  virtual int cluster() const = 0;
  virtual const ClusterLayout& layout() const = 0;
  // Which copy of the model state this rank's replica holds in checkpoints, and which of its writers this rank
  // is (see StatePlacement in optimizer.h): one copy where every replica is identical, else one per cluster
  // (diloco) or per replica (gossip, async, ssp).
  struct CheckpointCopy {
    int copy = 0, writer = 0, writers = 1;
  };
  virtual CheckpointCopy checkpoint_copy() const = 0;
  // `tensors`: what this rank keeps in agreement (the same order and shapes as its counterparts in the other
  // replicas); `sharded`: every rank of gradient_group() holds a different part; `changed`: called after the
  // strategy wrote into them (collective over gradient_group()).
  virtual void attach(std::vector<at::Tensor> tensors, bool sharded, std::function<void()> changed) = 0;
  // State kept per attached tensor that checkpoints save and restore (DiLoCo's outer momentum).
  virtual std::vector<ExtraState> state() { return {}; }
  // Before the first step of this run (`first_step` > 1 after a resume), with the attached tensors loaded.
  virtual void start(int64_t first_step) {}
  // Elastic training: what a generation carries to the next beyond state() and the optimizer's (not checkpointed;
  // views that adopting or healing the live state writes into).
  virtual std::vector<at::Tensor> live_tensors() { return {}; }
  // Elastic training, on every rank once a generation's live state is in place (after start(), before the first
  // step; collective): `received` when this rank's state was sent by another replica (a joiner).
  virtual void rebase(int64_t first_step, bool received) {}
  // Before the step's compute (ssp waits here for the slowest rank; the experiment's slowdown sleeps here).
  virtual void before_step(int64_t step) {}
  // After the gradients of `step` are in place and before clipping: returns the loss to report.
  virtual double after_backward(int64_t step, double loss) { return loss; }
  // After the optimizer step of `step`; on the last step every replica ends with the same parameters.
  virtual void after_step(int64_t step, bool last) {}
  // Before a run stopped early (Ctrl-C) saves after `step`: completes an exchange still in flight (streaming
  // DiLoCo), so the checkpoint holds its outer step instead of losing it. Collective, like after_step.
  virtual void settle(int64_t step) {}
  // async, whose ranks never wait for each other: a Ctrl-C travels with the pushes to the parameter server.
  // ask_to_stop: this rank was asked; stop_heard: this rank or another one was (it heard in a push's reply).
  virtual void ask_to_stop() {}
  virtual bool stop_heard() const { return false; }
  virtual SyncStats stats() const = 0;
};

struct SyncSetup {
  SyncConfig config;
  comm::Communicator* dp = nullptr;  // the data-parallel group (null when there is one replica)
  int dp_index = 0, dp_size = 1;
  int world_rank = 0;
  // Optional: tensors attached at once (and started at step 1), for callers without an optimizer.
  std::vector<at::Tensor> parameters;
  int64_t steps = 0;                   // the last step of the run
  int cluster_hint = -1;               // this node's cluster from the environment; -1: none
  comm::Millis timeout{30000};
};

// Checks [sync] (mode, periods, codec) for a layout; throws UsageError with one clear line. Every mode runs with
// every layout; hierarchical sync averages whole gradients across clusters and needs parallel.zero = 0.
void check_sync_config(const SyncConfig& config, int dp, int pp, int tp, int64_t zero);
// The node's cluster from CROSSTRAIN_CLUSTER or CT_CLUSTER; -1 when neither is set.
int cluster_from_environment();
// Pure: the cluster index of `host` in a topology (clusters numbered in order of first appearance). Throws
// UsageError naming the file when the host is not listed.
int cluster_of_host(const comm::Topology& topology, const std::string& host, const std::string& origin);
// This node's cluster: from the topology file when given (by this machine's host name), else the environment.
int cluster_of_this_node(const std::string& topology_path);
// Collective over setup.dp: builds the cluster groups and the strategy.
std::unique_ptr<SyncStrategy> make_sync_strategy(SyncSetup setup);

// ---- pure parts (unit-tested) -------------------------------------------------------------------------------

// Cluster of each data-parallel rank -> groups (see cluster_layout below).
ClusterLayout cluster_layout(const std::vector<int>& cluster_ids);
// `clusters` consecutive blocks of `dp` ranks (dp divisible by clusters).
std::vector<int> block_clusters(int dp, int clusters);
// Consecutive blocks of the given sizes (sync.cluster_ranks); throws UsageError unless they add up to `dp`.
std::vector<int> sized_clusters(int dp, const std::vector<int64_t>& sizes);
// sync.cluster_batch: the sequences per step of each data-parallel rank (for data::DistributedSampler), cluster
// c's count split evenly over its ranks; empty when `cluster_batch` is. Throws UsageError naming the key unless
// there is one count per cluster, each divisible by its cluster's ranks x micro_batches.
std::vector<int64_t> rank_batches(const ClusterLayout& layout, const std::vector<int64_t>& cluster_batch,
                                  int64_t micro_batches);
// DiLoCo's outer average weighs cluster c's pseudo-gradient by its share of the batch: the factor that turns the
// cross-cluster mean into that weighted mean (clusters x share; 1 for every cluster of an even split).
double outer_weight(const std::vector<int64_t>& cluster_batch, int cluster);

// One outer step: momentum = mu * momentum + delta; anchor -= lr * (nesterov ? delta + mu * momentum : momentum).
void outer_nesterov_step(at::Tensor& anchor, at::Tensor& momentum, const at::Tensor& delta, double lr, double mu,
                         bool nesterov);
// Gossip: the neighbour of rank `i` of `n` in round `round` (i itself: sits this round out). Hypercube pairs
// when n is a power of two, else the matching i <-> (2 round + 1 - i) mod n.
int gossip_partner(int i, int n, int64_t round);
// Streaming DiLoCo: fragment f of F syncs at the steps s with (s - offset(f)) % H == 0, offset = (f + 1) H / F.
int64_t fragment_offset(int64_t f, int64_t fragments, int64_t inner_steps);

}  // namespace crosstrain::train
