// `crosstrain plan MODEL CLUSTER` (time, memory, cost, energy and the binding wall of one layout, or the best
// layouts found by the search), `crosstrain plan --calibrate` (a cluster file for this host) and `crosstrain sim`
// (the discrete-event replay of one step, with a Perfetto trace): docs/planning.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/planner/estimate.h"

namespace crosstrain::apps {

struct PlanCommand {
  std::string model;                // preset name or recipe (.toml)
  std::string cluster;              // cluster file
  std::string layout;               // "dp=8 tp=8 pp=16 ..." (presets; a recipe's [parallel] otherwise)
  std::vector<std::string> sets;    // recipe overrides, as for crosstrain train
  int nproc = 0;                    // ranks of a recipe's run (0: every device of the cluster file)
  int64_t global_batch = 0;         // sequences per step (presets; a recipe's train.global_batch otherwise)
  double tokens = 0;                // training tokens for time-to-train, cost and energy
  bool search = false;
  int top = 5;
  std::string rank_by = "time";
  int devices = 0;                  // search: devices to use (0: all)
  bool json = false;
  bool calibrate = false;
  std::string out;                  // --calibrate: the cluster file to write
  std::string trace;                // sim: Perfetto trace file
};

// What a command plans: the model, the cluster and (without --search) the layout.
struct PlanInputs {
  planner::ModelShape model;
  planner::ClusterFile cluster;
  planner::Layout layout;
  int64_t global_batch = 0;
  bool has_layout = false;
};

// Pure apart from reading the files. Throws UsageError for bad input.
PlanInputs resolve_plan_inputs(const PlanCommand& cmd);

int plan_command(const PlanCommand& cmd);
int sim_command(const PlanCommand& cmd);

}  // namespace crosstrain::apps
