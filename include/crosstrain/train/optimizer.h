// The optimizer of the whole model state of a rank, whatever the layout: one interface for replicated AdamW
// (torch's, with the bucketed gradient all-reduce) and ZeRO's sharded AdamW (which reduces its own gradients).
// The trainer steps it, the checkpoint code saves and loads through it, and the sync strategies (sync_strategy.h)
// keep its tensors in agreement across clusters, so none of them branches on which one it is.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/grad_reducer.h"
#include "crosstrain/parallel/zero.h"

namespace crosstrain::train {

struct NamedParameter {
  std::string name;  // plain name of the single-device model
  at::Tensor tensor;
};

struct OptimizerConfig {
  parallel::AdamWHyper adam;
  int zero = 0;                        // 0: replicated AdamW; 1-3: ZeRO stage
  at::ScalarType dtype = at::kFloat;   // of parameters and gradients (bf16: fp32 master weights in ZeRO)
  int64_t bucket_bytes = 1 << 20;      // replicated: gradient all-reduce buckets
  std::string compression = "none";    // replicated: gradient codec
};

// Where this rank's tensors sit in the model, for checkpoints.
struct StatePlacement {
  std::map<std::string, std::vector<int64_t>> global_shapes;  // every parameter of the model, unsplit
  checkpoint::SplitFn split;                                  // whole tensor -> this rank's tensor-parallel shard
  int tp_rank = 0, tp_size = 1;
  // Replicas that may differ (DiLoCo's clusters between outer steps, each rank in gossip, async and ssp) keep
  // their own copy: copy 0 under the plain names, copy k under "<name>#copy<k>". A rank loads its own copy when
  // the checkpoint has it, else copy 0 (another number of clusters or replicas).
  int copy = 0;
  // The ranks that write one copy (replicated: each writes an even 1/writers of every tensor; ZeRO: each writes
  // the slices it owns).
  int writer = 0, writers = 1;
};

// State a sync strategy keeps per tensor of sync_tensors() (DiLoCo's outer momentum): saved beside the moments
// under `suffix`, loaded back (zeros when the checkpoint has none).
struct ExtraState {
  std::string suffix;               // "#outer_momentum"
  std::vector<at::Tensor> tensors;  // parallel to sync_tensors(), same shapes
};

class ModelOptimizer {
 public:
  virtual ~ModelOptimizer() = default;
  // "replicated AdamW, 3 gradient buckets" / "ZeRO-2 over 2 data-parallel ranks, 4 units"
  virtual std::string describe() const = 0;
  // Drives the gradient reduction during backward (data-parallel all-reduce or ZeRO's reduce-scatter).
  virtual parallel::GradReducer& reducer() = 0;
  // ZeRO-3: what the model calls around each unit to gather and release its parameters (null: nothing).
  virtual parallel::UnitHooks* unit_hooks() { return nullptr; }
  // ZeRO-3: gathers every parameter and keeps it, for reading them after training (collective).
  virtual void gather_parameters() {}
  virtual void step(double lr) = 0;
  void zero_grad() { reducer().zero_grad(); }
  // Sequence parallelism: sums the gradients of `partial` over the tensor-parallel group.
  virtual void sum_partial_gradients(const std::vector<at::Tensor>& partial, comm::Communicator& tp) = 0;
  // The whole model's gradient norm. `counted(name)`: this rank counts the parameter (replicated ones on one
  // tensor-parallel rank); `replica`: the other ranks of this model replica (null: none).
  virtual double gradient_norm(const std::function<bool(const std::string&)>& counted,
                               comm::Communicator* replica) = 0;
  virtual parallel::ModelStateBytes memory() const = 0;
  // This rank's gradients by name (tests compare them with a reference); empty where they are sharded.
  virtual std::map<std::string, at::Tensor> gradients() const = 0;

  // What sync strategies keep in agreement: the parameters (replicated), or the fp32 master slices this rank
  // owns (ZeRO: `sharded`, every rank of the data-parallel group holds a different part). After a strategy
  // wrote into them, sync_tensors_changed() brings the model's parameters up to date (collective).
  virtual std::vector<at::Tensor> sync_tensors() = 0;
  virtual bool sync_tensors_sharded() const = 0;
  virtual void sync_tensors_changed() = 0;

  // Checkpoints: a copy of the pieces this rank writes (parameters, "#exp_avg", "#exp_avg_sq" and `extra`).
  virtual std::vector<checkpoint::Piece> checkpoint_pieces(const StatePlacement& where,
                                                           const std::vector<ExtraState>& extra) = 0;
  // Checks that the checkpoint holds every tensor this rank needs with the right shape (UsageError naming it
  // otherwise), then loads; nothing changes unless every check passes.
  virtual void load(checkpoint::CheckpointReader& reader, const StatePlacement& where,
                    const std::vector<ExtraState>& extra) = 0;
  virtual int64_t step_count() const = 0;

  // Elastic training: this rank's whole optimizer state as tensors it owns (parameters or fp32 masters, then each
  // one's moments), in an order that is the same on every replica of the same (pp, tp) coordinate. Writing into
  // them (then set_step_count and sync_tensors_changed) replaces the state. ZeRO: the owned slices (the same
  // shapes on the rank of each copy that holds the same shard; a copy is whole only with HSDP).
  virtual std::vector<at::Tensor> live_state() = 0;
  virtual void set_step_count(int64_t steps) = 0;
};

// `units`: this rank's parameters grouped as ZeRO gathers them (embedding, blocks, head), in forward order.
// `group`: the data-parallel group of the per-step gradient reduction (null: none, every rank steps alone); ZeRO
// shards over it. `copies` (ZeRO with HSDP, else null): the ranks that hold this rank's shard in the other copies.
std::unique_ptr<ModelOptimizer> make_optimizer(const std::vector<std::vector<NamedParameter>>& units,
                                               comm::Communicator* group, const OptimizerConfig& config,
                                               comm::Communicator* copies = nullptr);

}  // namespace crosstrain::train
