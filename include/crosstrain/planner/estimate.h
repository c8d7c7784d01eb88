// The analytic model of one training step: time (compute, exposed tensor-parallel, pipeline bubble and transfers,
// data-parallel and wide-area communication), memory per device, cost, energy and the binding wall. Pure: built
// on the collective cost model of comm/cost_model.h and the schedules of parallel/schedule.h.
//
//   Estimate e = estimate(model, cluster, layout, {.tokens = 300e9});
//   e.time.step_s, e.memory.total_bytes, e.cost, e.wall
//
// How a step is costed (the same inputs feed the discrete-event replay of planner/simulate.h):
//  - StepModel: per virtual stage, the seconds of one micro-batch's forward, backward (input and weight parts)
//    on its device, tensor-parallel collectives that cannot overlap included; the bytes and link of each
//    pipeline boundary; each pipeline rank's gradient synchronisation (bytes, group, predicted seconds).
//  - The analytic step time is the schedule's makespan with those costs (parallel::simulate, communication
//    added on the critical path), plus the exposed gradient synchronisation, the optimizer and the amortised
//    wide-area exchange.
#pragma once

#include <string>
#include <vector>

#include "crosstrain/comm/cost_model.h"
#include "crosstrain/parallel/schedule.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/planner/layout.h"
#include "crosstrain/planner/model_shape.h"

namespace crosstrain::planner {

// Seconds of one micro-batch on one virtual stage.
struct StageCosts {
  double forward_s = 0;
  double backward_s = 0;          // full backward (input + weight)
  double backward_input_s = 0;    // zero-bubble split: the part the previous stage waits for
  double backward_weight_s = 0;   // backward_s - backward_input_s
  double tp_comm_s = 0;           // of the above, exposed tensor-parallel collectives (forward + backward)
};

// Where a pipeline rank runs and which link a message between two places crosses.
struct Placement {
  int cluster = 0;  // index into ClusterFile::clusters
  int host = 0;     // host index inside the cluster
};

struct StepModel {
  parallel::ScheduleSpec schedule{parallel::ScheduleKind::OneFOneB, 1, 1, 1};
  std::vector<StageCosts> stages;       // [virtual stage]
  std::vector<int64_t> stage_layers;     // [virtual stage]: blocks it holds (the layout's, or the balanced split)
  std::vector<Placement> pp_rank_place;  // [pipeline rank]: where its first tp rank of replica 0 runs
  double boundary_bytes = 0;             // one activation (or its gradient) message between virtual stages
  std::vector<comm::Link> boundary_link;  // [virtual stage s]: link crossed from s to s+1 (size p*v - 1)
  // Physical resource id of each boundary's link: transfers with the same id share its bandwidth (a host's NIC,
  // a wide-area link); -1: a private link (no sharing).
  std::vector<int> boundary_resource;
  std::vector<double> dp_bytes;          // [pipeline rank]: gradient bytes each rank synchronises per step
  std::vector<double> dp_sync_s;         // [pipeline rank]: predicted seconds of that synchronisation
  double dp_overlap = 0;                 // fraction of dp_sync_s hidden behind the backward (0..1)
  std::vector<double> optimizer_s;       // [pipeline rank]
  double wan_s_per_step = 0;             // cross-cluster exchange, amortised over the steps that share it
};

struct TimeBreakdown {
  double compute_s = 0;        // forward + backward on the slowest pipeline rank, tp collectives excluded
  double tp_exposed_s = 0;     // tensor-parallel collectives on that rank's critical path
  double pp_bubble_s = 0;      // idle time of the pipeline's schedule
  double pp_transfer_s = 0;    // exposed activation and gradient transfers between stages
  double dp_exposed_s = 0;     // gradient synchronisation not hidden behind the backward
  double wan_exposed_s = 0;    // cross-cluster synchronisation per step (diloco: outer exchange / H)
  double optimizer_s = 0;
  double step_s = 0;           // the sum
};

struct MemoryBreakdown {
  double parameters_bytes = 0;
  double gradients_bytes = 0;
  double optimizer_bytes = 0;       // Adam moments and fp32 master weights (mixed precision), ZeRO-sharded
  double activations_bytes = 0;     // per in-flight micro-batch x in-flight count, with this layout's recompute
  double activations_no_recompute_bytes = 0;  // the same without recompute (for the report)
  int in_flight_microbatches = 0;
  double buffers_bytes = 0;         // communication buckets, gathered ZeRO-3 units, logits
  double total_bytes = 0;
  double capacity_bytes = 0;        // the device's memory
  bool fits = true;
};

struct EstimateOptions {
  double tokens = 0;           // training tokens for time-to-train, cost and energy; 0: one step only
  const MemoryBreakdown* memory = nullptr;  // already estimated for this layout (the search prunes with it first)
};

struct Estimate {
  Layout layout;               // as given, with stage_layers filled in with the split the estimate used
  StepModel step_model;
  TimeBreakdown time;
  MemoryBreakdown memory;      // the most loaded device
  double tokens_per_step = 0;
  double model_flops_per_step = 0;     // 6N + attention, per step, all devices
  double hardware_flops_per_step = 0;  // with recompute's extra forward
  double tokens_per_s = 0;
  double flops_per_device = 0;         // achieved hardware FLOP/s per device (Megatron's "TFLOP/s per GPU")
  double mfu = 0;                      // model FLOP/s over the devices' peak
  double time_to_train_s = 0;
  double device_hours = 0;
  double cost = 0;                     // device-hours x price
  double energy_j = 0;                 // power x time, every device
  double scaling_efficiency = 0;       // (one device's time for the same tokens) / (this time x devices)
  std::string wall;                    // compute, memory or communication
  bool feasible = true;
  std::string infeasible_reason;       // why not (does not fit, layout does not divide the model, ...)
};

// Throws UsageError when the layout cannot run the model on the cluster at all (more devices than there are, tp
// not dividing heads, ...); a layout that runs but does not fit in memory comes back with feasible = false.
Estimate estimate(const ModelShape& model, const ClusterFile& cluster, const Layout& layout,
                  const EstimateOptions& options = {});
// The StepModel alone (what estimate() and simulate() share).
StepModel build_step_model(const ModelShape& model, const ClusterFile& cluster, const Layout& layout);
// Memory per device only (cheap; the search prunes with it).
MemoryBreakdown estimate_memory(const ModelShape& model, const ClusterFile& cluster, const Layout& layout);

}  // namespace crosstrain::planner
