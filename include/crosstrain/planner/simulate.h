// A discrete-event replay of one training step from the planner's StepModel (planner/estimate.h), to cross-check
// the analytic estimate: every pipeline rank executes its schedule's action list (parallel::build_schedule) with
// the StepModel's per-stage costs; each activation or gradient transfer is a flow over its boundary's link, and
// flows on the same physical resource share its bandwidth (max-min fair share, recomputed whenever a flow starts
// or ends); the gradient synchronisation of each pipeline rank starts when its last backward ends (minus the
// overlapped part) and the optimizer follows it. Pure: no communication, no libtorch.
//
// The rules, precisely:
//  - Rank r executes its list in order. Forward, Backward, BackwardInput and BackwardWeight of virtual stage s
//    take stages[s].forward_s, backward_s, backward_input_s and backward_weight_s.
//  - A Send never blocks (the runtime posts sends asynchronously): it starts a flow over the link of the
//    boundary it crosses (an activation from stage s to s+1, or a gradient from s+1 back to s, crosses boundary
//    s: boundary_link[s], boundary_resource[s]). A Recv blocks its rank until that flow has fully arrived.
//  - A flow of b bytes over link L first spends L.seconds(0) (the latency; the first sample of a measured curve)
//    on its own, then needs L.seconds(b) - L.seconds(0) seconds of the link at full rate. While k flows on one
//    resource id (>= 0) are past their latency, each gets 1/k of the rate (equal, max-min fair share: every
//    flow uses one resource); the shares change whenever a flow starts or ends. Resource -1: never shared.
//  - When rank r has executed its list, its gradient synchronisation shows dp_sync_s[r] - dp_overlap x
//    min(dp_sync_s[r], B_r) seconds, B_r being one micro-batch's backward on the rank (the rest ran under it), then
//    optimizer_s[r] runs. The step ends when the last rank's
//    optimizer ends, plus wan_s_per_step, the amortised cross-cluster exchange, which every rank waits for.
//
//   SimulationReport r = simulate_step(build_step_model(model, cluster, layout));
//   r.step_s;                      // predicted step time
//   write_text_file(path, r.perfetto_json);   // open in ui.perfetto.dev or chrome://tracing
#pragma once

#include <string>
#include <vector>

#include "crosstrain/planner/estimate.h"

namespace crosstrain::planner {

struct SimulatedSpan {
  int pp_rank = 0;
  // "F mb3 c0", "B mb3 c0", "Bi ...", "Bw ...", "send act mb3 c0", "send grad mb3 c0" (sender's chunk),
  // "dp sync" (its exposed part), "optimizer", "wan exchange"; the last three only when they take time.
  std::string name;
  std::string category;  // compute, transfer, dp, optimizer, wan
  double start_s = 0, end_s = 0;
};

struct SimulationReport {
  double step_s = 0;                  // when the last rank's optimizer ends, plus the wide-area exchange
  int critical_rank = 0;              // the rank whose optimizer ends last (the lowest one on a tie)
  std::vector<double> busy_s;         // [pipeline rank] compute seconds
  std::vector<double> recv_wait_s;    // [pipeline rank] seconds blocked in receives: bubble + exposed transfers
  // Seconds the critical rank waited in receives for messages already sent (in flight): the transfers it
  // exposed. Waiting for a message not yet sent is bubble (the sender still computing) and is not counted.
  double pp_transfer_s = 0;
  std::vector<SimulatedSpan> spans;   // every action, transfer and collective, in start order (when tracing)
  // Chrome/Perfetto trace events of `spans`, times in microseconds: "X" events on pid 0, tid = pipeline rank
  // for compute, dp, optimizer and wan ("pp rank R"); transfers, which overlap the sender's computations and each
  // other, on tracks of their own ("pp rank R sends", tid p*(1+lane) + R, one lane per overlapping transfer).
  std::string perfetto_json;
};

struct SimulationOptions {
  bool trace = true;  // fill spans and perfetto_json
};

// Throws UsageError for an inconsistent StepModel (sizes that do not match the schedule, negative costs) or a
// deadlock (naming every blocked rank and the receive it waits for).
SimulationReport simulate_step(const StepModel& model, const SimulationOptions& options = {});
// The same with given action lists ([pipeline rank], as parallel::build_schedule(model.schedule) returns them),
// e.g. a hand-edited schedule; they are not checked beyond ranges and peers, so an unmatched receive is a
// deadlock and an unreceived send simply arrives.
SimulationReport simulate_step(const StepModel& model, const std::vector<std::vector<parallel::Action>>& actions,
                               const SimulationOptions& options = {});

}  // namespace crosstrain::planner
