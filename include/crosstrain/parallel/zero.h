// ZeRO-1/2/3: data parallelism that shards the model state over the data-parallel ranks instead of copying it.
//
// Parameters are grouped into units (for a GPT: the embedding, each block, the head), in forward order. Each
// unit is laid out flat and padded to a multiple of the data-parallel size N; rank r owns slice r of every
// unit. The optimizer (AdamW, elementwise the same as torch's) only ever touches owned slices:
//   stage 1: gradients are full (views into per-unit buffers) and all-reduced; the owned slice is updated,
//            then the parameters are all-gathered.                               bytes/param: 4 + 4 + 8/N
//   stage 2: each unit's gradients are reduce-scattered as soon as backward has produced them and the full
//            gradients freed; only the owned gradient slice stays.                bytes/param: 4 + 12/N
//   stage 3: parameters are sharded too: a unit is all-gathered just before its forward and its backward (the
//            next one prefetched while the current one computes) and released after.   bytes/param: 16/N
// (fp32 parameters and gradients with fp32 Adam moments.) With bf16 mixed precision the model computes with
// bf16 parameters and gradients while the optimizer keeps fp32 master weights and moments for its slices: the
// ZeRO paper's 2 + 2 + 12 bytes (stage 1: 4 + 12/N, stage 2: 2 + 14/N, stage 3: 16/N). The same object is the
// gradient reducer the trainer drives and the optimizer it steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/grad_hooks.h"
#include "crosstrain/parallel/grad_reducer.h"

namespace crosstrain::parallel {

struct AdamWHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// torch::optim::AdamW's update on flat tensors, elementwise (so any slicing of a parameter gives the same
// numbers): decoupled decay `p *= 1 - lr*wd` (when `decay`), then Adam with bias correction. `step` counts from 1.
void adamw_update(at::Tensor param, const at::Tensor& grad, at::Tensor exp_avg, at::Tensor exp_avg_sq, int64_t step,
                  const AdamWHyper& h, bool decay);

// Pure: the padded flat length of a unit of `numel` elements over `ranks` ranks, and each rank's slice.
int64_t zero_padded_size(int64_t numel, int ranks);
struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
// The parts of parameter ranges [offsets[i], offsets[i] + sizes[i]) that fall inside `owned`.
struct OwnedPart {
  size_t param = 0;        // index in the unit
  int64_t param_offset = 0;  // first element of the part inside the (flattened) parameter
  int64_t shard_offset = 0;  // first element inside the owned slice
  int64_t size = 0;
};
std::vector<OwnedPart> owned_parts(const std::vector<int64_t>& param_sizes, Range owned);

struct ZeroParam {
  at::Tensor tensor;
  bool decay = true;  // weight decay applies (matrices); not to biases, LayerNorm gains, ...
};

struct ZeroConfig {
  int stage = 1;
  AdamWHyper adam;
  at::ScalarType dtype = at::kFloat;  // of the model's parameters and gradients: kFloat, or kBFloat16 (mixed precision)
};

// What a rank holds, in bytes (persistent buffers; stage 3's temporarily gathered units are reported apart).
struct ModelStateBytes {
  int64_t parameters = 0;
  int64_t gradients = 0;
  int64_t optimizer = 0;
  int64_t gathered_peak = 0;  // stage 3: most bytes of gathered units held at once
  int64_t total() const { return parameters + gradients + optimizer; }
};

// Called by a model around each unit's computation (stage 3 gathers and releases parameters there).
class UnitHooks {
 public:
  virtual ~UnitHooks() = default;
  virtual void before_unit(int unit) = 0;
  // Returns `output` (possibly with a hook attached that gathers the unit again before its backward).
  virtual at::Tensor after_unit(int unit, const at::Tensor& output) = 0;
};

class ZeroOptimizer : public GradReducer, public UnitHooks {
 public:
  // `units`: this rank's parameters grouped into units, in forward order; the same shapes on every
  // data-parallel rank. `dp`: the ranks the state is sharded over (null or of size 1: none). `replicate` (HSDP,
  // may be null): the ranks that hold the same shard in the other copies of the state; each gradient slice is
  // averaged over them after the reduce-scatter. Parameters are re-bound to views of the unit buffers.
  ZeroOptimizer(std::vector<std::vector<ZeroParam>> units, comm::Communicator* dp, ZeroConfig config,
                comm::Communicator* replicate = nullptr);
  ~ZeroOptimizer() override;
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // GradReducer. Stages 2 and 3 reduce every backward pass (micro-batches accumulate into the owned slice),
  // so set_sync only matters for stage 1.
  void set_sync(bool sync) override { sync_ = sync; }
  void zero_grad() override;
  void finish() override;
  void synchronize() override;
  ReducerStats stats() const override { return stats_; }
  // Norm of the whole replica's gradient (the owned slices' squares summed over the data-parallel ranks).
  double gradient_norm() const override;
  void scale_gradients(double factor) override;
  void set_side_value(int index, double value) override;
  double side_value(int index) const override;

  // Sum of squares of the owned gradient elements of the parameters `counted` accepts (unit, index):
  // for norms across tensor- and pipeline-parallel ranks, where replicated parameters count once.
  double owned_squared_norm(const std::function<bool(int unit, size_t param)>& counted) const;
  // Sums the owned gradient elements of the selected parameters over `group` (sequence parallelism's
  // partial gradients of replicated parameters).
  void all_reduce_owned_gradients(const std::function<bool(int unit, size_t param)>& selected,
                                  comm::Communicator& group);

  // Optimizer step on the owned slices with the learning rate `lr`, then (stages 1-2) the all-gather.
  void step(double lr);
  int64_t step_count() const { return step_count_; }
  void set_step_count(int64_t n) { step_count_ = n; }
  // After the fp32 master slices were written (a checkpoint loaded): refreshes the low-precision copies.
  void master_weights_changed();

  // UnitHooks (stage 3; no-ops otherwise).
  void before_unit(int unit) override;
  at::Tensor after_unit(int unit, const at::Tensor& output) override;
  // Stage 3: gathers every unit and keeps it (for reading parameters after training). Collective.
  void gather_all_parameters();

  ModelStateBytes memory() const;
  int stage() const { return config_.stage; }
  int unit_count() const { return static_cast<int>(units_.size()); }
  static constexpr int kSideValues = 4;

  // The owned slices, for checkpoints: views into the live buffers (write to them to load).
  struct OwnedSlice {
    int unit = 0;
    size_t param = 0;
    at::Tensor tensor;           // the parameter (as given to the constructor)
    int64_t param_offset = 0;    // first element inside the flattened parameter
    at::Tensor value, exp_avg, exp_avg_sq;  // 1-D views, same size
  };
  std::vector<OwnedSlice> owned_slices();
  // Every owned tensor of the state, per unit: the fp32 master slice and its two moments (padding included).
  // The same shapes on every copy's rank of the same shard: what elastic training hands to a joining copy.
  std::vector<at::Tensor> state_tensors();

 private:
  using Clock = std::chrono::steady_clock;
  enum class Gather { Released, InFlight, Ready };
  struct Unit {
    std::vector<ZeroParam> params;
    std::vector<int64_t> sizes;
    int64_t numel = 0, padded = 0, shard = 0;
    at::Tensor full;         // padded flat parameters (stage 3: storage allocated only while gathered)
    at::Tensor master;       // owned fp32 parameter slice (a view of `full` in fp32 stages 1-2)
    at::Tensor low;          // bf16 stage 3: the owned slice in the model's dtype, the all-gather's input
    at::Tensor full_grads;   // stage 1: padded flat gradients, each .grad a view
    at::Tensor grad_shard;   // owned gradient slice (a view of full_grads in stage 1)
    at::Tensor exp_avg, exp_avg_sq;
    std::vector<OwnedPart> parts;
    std::vector<at::Tensor> grad_views;  // stage 1
    int pending = 0;
    comm::WorkPtr work;       // reduction in flight
    at::Tensor reduce_in, reduce_out;  // stages 2-3: kept alive while the reduction runs
    Clock::time_point launched, completed;
    bool done = false;
    Gather gathered = Gather::Ready;
    comm::WorkPtr gather_work;
  };

  at::Tensor owned_values(const Unit& u) const;  // the owned slice of the parameters' values, fp32
  void rebind_parameters(Unit& u);
  // Stages 2-3: waits for a unit's reduce-scatter, adds it to the owned gradient slice and frees its buffers.
  void absorb_reduction(Unit& u);
  void average_over_copies(at::Tensor& t);  // HSDP: the mean over the replicate group
  void absorb_finished_reductions(const Unit& next);
  void attach_hooks();
  bool on_gradient_ready(int unit);
  void launch_ready();
  void launch(Unit& u);
  void reset_pass();
  void start_gather(int unit);
  void wait_gather(int unit);
  void release(int unit);
  void allocate_full(Unit& u);
  int64_t gathered_bytes() const;

  std::vector<Unit> units_;
  comm::Communicator* comm_;
  comm::Communicator* replicate_;  // null without HSDP
  int ranks_ = 1, rank_ = 0;
  ZeroConfig config_;
  bool sync_ = true;
  size_t next_launch_ = 0;  // index into launch order (reverse unit order)
  int64_t step_count_ = 0;
  at::Tensor side_;        // side values, averaged at the end of a syncing pass
  Clock::time_point backward_done_;
  ReducerStats stats_;
  int64_t gathered_peak_ = 0;
  // Last, so it is destroyed first: disarmed before anything its callbacks use goes.
  std::unique_ptr<GradientHooks> hooks_;
};

}  // namespace crosstrain::parallel
