// `crosstrain sim`: the discrete-event replay of one step next to the analytic estimate, and its Perfetto trace.
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/simulate.h"
#include "plan_cmd.h"

namespace crosstrain::apps {

int sim_command(const PlanCommand& cmd) {
  const PlanInputs in = resolve_plan_inputs(cmd);
  if (!in.has_layout) throw UsageError("crosstrain sim needs a layout: a recipe, or --layout for a preset");
  const planner::Estimate e = planner::estimate(in.model, in.cluster, in.layout);
  const planner::SimulationReport r = planner::simulate_step(e.step_model);
  const std::string trace = cmd.trace.empty() ? "sim-trace.json" : cmd.trace;
  std::ofstream out(trace);
  if (!(out << r.perfetto_json)) throw UsageError("cannot write the trace to '" + trace + "'");
  const double diff = 100 * (r.step_s - e.time.step_s) / e.time.step_s;
  if (cmd.json) {
    std::cout << nlohmann::json{{"layout", e.layout.describe()}, {"sim_step_s", r.step_s},
                                {"analytic_step_s", e.time.step_s}, {"difference_pct", diff}, {"trace", trace}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("model     %s\nlayout    %s\n", in.model.describe().c_str(), e.layout.describe().c_str());
  std::printf("step      simulated %.6g s, analytic %.6g s (%+.1f%%)\n", r.step_s, e.time.step_s, diff);
  for (size_t rank = 0; rank < r.busy_s.size(); ++rank)
    std::printf("pp rank %zu busy %.6g s (%.0f%% of the step)\n", rank, r.busy_s[rank], 100 * r.busy_s[rank] / r.step_s);
  std::printf("trace     %s (%zu spans; open in ui.perfetto.dev)\n", trace.c_str(), r.spans.size());
  return 0;
}

}  // namespace crosstrain::apps
