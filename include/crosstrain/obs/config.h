// [obs]: what a run records about itself (docs/observability.md): always-on traces, the flight recorder of
// collectives for hang diagnosis, online straggler detection and the live metrics endpoint.
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::obs {

struct ObsConfig {
  bool trace = true;                    // each rank writes run.dir/traces/rank-R.json (Chrome/Perfetto JSON)
  int64_t trace_flush_every = 200;      // steps between appends to the trace file (and at the end)
  int64_t trace_buffer_events = 200000; // events held in memory between appends; beyond it the oldest are dropped
  int64_t flight_records = 64;          // the last N collectives of each rank, named in a timeout's diagnosis
  int64_t straggler_every = 5;          // steps between exchanges of per-rank step timings (0: off)
  double straggler_margin = 0.25;       // a rank busier than the median by this fraction ...
  double straggler_min_ms = 2;          // ... and by at least this much a step (noise on millisecond steps) ...
  int64_t straggler_windows = 2;        // ... in this many exchanges in a row is named a straggler
  int64_t metrics_port = 0;             // rank 0 serves Prometheus text on http://metrics_host:port/metrics (0: off)
  std::string metrics_host = "127.0.0.1";
};

// The [obs] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(ObsConfig& c, Key&& key) {
  key("trace", c.trace, "each rank writes run.dir/traces/rank-R.json (Perfetto / chrome://tracing)");
  key("trace_flush_every", c.trace_flush_every, "steps between appends to the trace files");
  key("trace_buffer_events", c.trace_buffer_events,
      "trace events held in memory between appends; beyond it the oldest are dropped");
  key("flight_records", c.flight_records, "the last N collectives of each rank, named when a wait times out");
  key("straggler_every", c.straggler_every,
      "steps between exchanges of per-rank step times (straggler detection); 0: off");
  key("straggler_margin", c.straggler_margin, "a straggler is busier than the median by this share ...");
  key("straggler_min_ms", c.straggler_min_ms, "... and by at least this many milliseconds a step ...");
  key("straggler_windows", c.straggler_windows, "... in this many exchanges in a row");
  key("metrics_port", c.metrics_port, "rank 0 serves Prometheus metrics on http://metrics_host:port/metrics; 0: off");
  key("metrics_host", c.metrics_host, "the address the metrics endpoint listens on");
}

}  // namespace crosstrain::obs
