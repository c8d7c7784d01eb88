// Where each rank's time went, from its trace events (docs/observability.md): compute, exposed communication and
// idle time per step, how much communication hid behind compute, the pipeline bubble, memory, and stragglers.
// Pure logic on parsed events: no files, no clocks.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <vector>

namespace crosstrain::obs {

// A half-open span of time [begin, end), in microseconds.
struct Interval {
  double begin = 0, end = 0;
};
using Intervals = std::vector<Interval>;

// Sorted, with overlapping and touching spans joined.
Intervals merged(Intervals spans);
// Time covered by both (`a` and `b` merged).
Intervals intersection(const Intervals& a, const Intervals& b);
// Time covered by `a` but not by `b` (both merged).
Intervals difference(const Intervals& a, const Intervals& b);
double total_length(const Intervals& spans);

struct RankTimes {
  int rank = 0;                                  // pid: the global rank
  int dp_index = -1, pp_index = -1, tp_index = -1;  // from crosstrain_clock; -1 when absent
  int64_t steps = 0;                             // `step` spans
  // Totals over the steps, in microseconds. Everything is counted inside `step` spans only, so the three parts
  // add up to the step time: step = compute + exposed + idle.
  double step_us = 0;
  double compute_us = 0;  // cat compute and optimizer on tid 0, less the waits inside them
  double exposed_us = 0;  // tid 0 blocked: `wait` spans and pipeline receives (cat p2p, recv_*)
  double idle_us = 0;     // the rest: data loading, sync-mode work, host overhead, sleeps
  double comm_us = 0;     // union of the collectives on the lanes (tid >= 1), cat comm
  double overlap = -1;    // 1 - exposed / comm, in [0, 1]; -1 without communication
  double bubble = -1;     // pipeline (pp > 1): 1 - compute / step; -1 otherwise
  double busy_per_step_us = 0;  // (step - exposed) / steps: the rank's own work, waiting on others left out
  double straggler_ratio = 0;   // busy_per_step over the median of the ranks
  // The last `memory` counter.
  bool has_memory = false;
  double rss_bytes = 0, peak_rss_bytes = 0, model_state_bytes = 0;
  int64_t dropped_events = 0;   // sum of the `dropped_events` counters, one per append (0: the trace is whole)
};

struct TraceAnalysis {
  std::vector<RankTimes> ranks;  // by rank
  int pp = 1;                    // pipeline stages, from crosstrain_clock
  double overlap = -1;           // over all ranks: 1 - sum(exposed) / sum(comm); -1 without communication
  double bubble = -1;            // pp > 1: mean of the ranks' bubbles
  double median_busy_per_step_us = 0;
  int busiest_rank = -1;         // highest straggler ratio
  int straggler_rank = -1;       // the busiest rank when its ratio exceeds 1 + margin, else -1
  double straggler_margin = 0.25;
};

// The analysis of the events of any number of ranks (grouped by pid); clock offsets play no part.
TraceAnalysis analyze_trace(const nlohmann::json& events, double straggler_margin = 0.25);

}  // namespace crosstrain::obs
