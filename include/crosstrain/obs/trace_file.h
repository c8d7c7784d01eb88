// Reading the per-rank trace files (run.dir/traces/rank-R.json, docs/observability.md) and merging them into one
// timeline on rank 0's clock: `crosstrain trace merge RUN_DIR`.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::obs {

// The events of one Chrome trace file in the JSON array format, as a JSON array. Accepts what a rank writes: no
// closing `]`, a trailing comma, and (a crashed run) a torn last line, which is dropped. Anything else that does
// not parse is a UsageError naming the file and the line.
nlohmann::json read_trace_file(const std::string& path);

// The same from text; `name` is what error messages call it.
nlohmann::json parse_trace_text(const std::string& text, const std::string& name);

// One rank's trace file.
struct RankTraceFile {
  int rank = 0;
  std::string path;
};

// run_dir/traces/rank-R.json of every rank, by rank. A UsageError when there are none (it suggests obs.trace).
std::vector<RankTraceFile> find_trace_files(const std::string& run_dir);

// The `offset_us` of the trace's `crosstrain_clock` metadata event (0 when it has none: `has_clock` says so).
struct ClockInfo {
  double offset_us = 0;
  bool has_clock = false;
};
ClockInfo clock_of(const nlohmann::json& events);

// Events of several ranks on one clock: each rank's timed events shifted by its offset (that of the latest
// crosstrain_clock event before them: a resumed run appends one of its own), then all the timed events (X, C, ...)
// sorted by ts after every metadata (M) event, which keeps its place.
nlohmann::json align_and_sort(const std::vector<nlohmann::json>& rank_events);

struct MergeSummary {
  std::string path;                 // the merged file
  int ranks = 0;
  int64_t events = 0;               // all events written, metadata included
  double begin_us = 0, end_us = 0;  // first ts and last ts + dur of the timed events, on rank 0's clock
  std::vector<int> ranks_without_clock;  // their events are left on their own clock
};

// Writes run_dir/traces/merged.json: {"traceEvents": [...], "displayTimeUnit": "ms"}.
MergeSummary merge_traces(const std::string& run_dir);

}  // namespace crosstrain::obs
