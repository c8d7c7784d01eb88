// `crosstrain bench scheduler` (make bench-scheduler): gang jobs submitted to simulated clusters through the real
// scheduler, placement and SQLite store on disk, with one cluster lost half-way. What it prints:
//   placements_per_s  placements made (re-placements included) over the wall time of the whole run (submissions,
//                     passes, polls, commits)
//   decision_p95_ms   95th percentile of one placement: the planner's choice, the reservation and its transaction
//   partial_gangs     starts the executor saw that did not cover every rank of a job (must be 0)
//   replace_after_loss_s  wall seconds from the executor reporting the cluster lost to every job that ran there
//                     placed again (simulated waiting for capacity, if any, is printed apart; jobs that only the
//                     lost cluster could hold wait for it and are counted apart as stranded)
#pragma once

#include <cstdint>
#include <random>
#include <string>

#include "crosstrain/scheduler/job.h"
#include "crosstrain/scheduler/registry.h"

namespace crosstrain::scheduler {

struct SchedulerBenchOptions {
  int jobs = 1000;
  int clusters = 6;               // 3..8
  uint64_t seed = 1;
  std::string state_path;         // the SQLite file (replaced); required
  bool synchronous_full = true;   // SQLite synchronous=FULL (else NORMAL)
  double interarrival_s = 20;     // simulated seconds between submissions
};

struct SchedulerBenchResult {
  int jobs = 0, clusters = 0, devices = 0;
  int64_t placements = 0, rejected = 0, done = 0, spanning = 0, diloco = 0;
  int64_t failed = 0;         // rejected at submission, or past their deadline while queued
  int64_t queued_at_end = 0;  // waiting for the lost cluster when the run ends
  double wall_s = 0, placements_per_s = 0, decision_p50_ms = 0, decision_p95_ms = 0, decision_max_ms = 0;
  int64_t partial_gangs = 0, overcommits = 0;
  std::string lost_cluster;
  int displaced = 0;
  int stranded = 0;  // displaced jobs only the lost cluster could hold (they wait for it; not in the time)
  double replace_after_loss_s = 0, replace_wait_sim_s = 0;
  std::string line() const;  // "placements_per_s=... decision_p95_ms=... partial_gangs=... replace_after_loss_s=..."
};

// Clusters of H100, A100 and L40S of 32..256 devices, joined by wide-area links of 1, 10 or 100 Gbit/s.
Registry bench_registry(int clusters, std::mt19937_64& rng);
// A GPT-2 or Llama job of 8..256 ranks; some with a wide-area or deadline QoS.
JobSpec bench_job(int index, std::mt19937_64& rng);
SchedulerBenchResult run_scheduler_bench(const SchedulerBenchOptions& options);

}  // namespace crosstrain::scheduler
