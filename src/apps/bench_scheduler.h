// `crosstrain bench scheduler` (make bench-scheduler): 1,000 gang jobs through the scheduler onto simulated
// clusters, its SQLite state on disk (scheduler/bench.h).
#pragma once

#include <CLI/CLI.hpp>

#include "crosstrain/scheduler/bench.h"

namespace crosstrain::apps {

struct BenchSchedulerCli {
  CLI::App* cmd = nullptr;
  scheduler::SchedulerBenchOptions options;
  bool normal_sync = false;
};

void add_bench_scheduler_command(CLI::App& bench, BenchSchedulerCli& cli);
// Prints the run's summary and the `placements_per_s= ...` line. Returns the exit code.
int bench_scheduler(const BenchSchedulerCli& cli);

}  // namespace crosstrain::apps
