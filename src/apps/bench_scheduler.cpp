#include "bench_scheduler.h"

#include <cstdio>
#include <filesystem>

namespace crosstrain::apps {

void add_bench_scheduler_command(CLI::App& bench, BenchSchedulerCli& cli) {
  scheduler::SchedulerBenchOptions& o = cli.options;
  cli.cmd = bench.add_subcommand("scheduler", "gang jobs through the scheduler onto simulated clusters (SQLite on disk)");
  cli.cmd->add_option("--jobs", o.jobs, "jobs to submit")->check(CLI::Range(2, 1000000));
  cli.cmd->add_option("--clusters", o.clusters, "simulated clusters")->check(CLI::Range(2, 16));
  cli.cmd->add_option("--seed", o.seed, "clusters, links and jobs are drawn from it");
  cli.cmd->add_option("--interarrival", o.interarrival_s, "simulated seconds between submissions")
      ->check(CLI::PositiveNumber);
  cli.cmd->add_option("--state", o.state_path, "the SQLite state file (replaced; default: a temporary file)");
  cli.cmd->add_flag("--sync-normal", cli.normal_sync, "SQLite synchronous=NORMAL instead of FULL");
}

int bench_scheduler(const BenchSchedulerCli& cli) {
  scheduler::SchedulerBenchOptions o = cli.options;
  o.synchronous_full = !cli.normal_sync;
  const bool temporary = o.state_path.empty();
  if (temporary) o.state_path = (std::filesystem::temp_directory_path() / "crosstrain-bench-scheduler.db").string();
  const scheduler::SchedulerBenchResult r = scheduler::run_scheduler_bench(o);
  std::printf("clusters=%d devices=%d jobs=%d state=%s synchronous=%s\n", r.clusters, r.devices, r.jobs,
              o.state_path.c_str(), o.synchronous_full ? "FULL" : "NORMAL");
  std::printf("placements=%lld (spanning %lld, diloco %lld) rejected=%lld done=%lld wall_s=%.2f\n",
              static_cast<long long>(r.placements), static_cast<long long>(r.spanning),
              static_cast<long long>(r.diloco), static_cast<long long>(r.rejected), static_cast<long long>(r.done),
              r.wall_s);
  std::printf("failed=%lld (rejected at submission or deadline passed in the queue) queued_at_end=%lld\n",
              static_cast<long long>(r.failed), static_cast<long long>(r.queued_at_end));
  std::printf("decision_p50_ms=%.2f decision_max_ms=%.2f overcommits=%lld\n", r.decision_p50_ms, r.decision_max_ms,
              static_cast<long long>(r.overcommits));
  std::printf("lost=%s displaced=%d stranded=%d replace_wait_simulated_s=%.0f\n", r.lost_cluster.c_str(),
              r.displaced, r.stranded, r.replace_wait_sim_s);
  std::printf("%s\n", r.line().c_str());
  if (temporary)
    for (const char* s : {"", "-wal", "-shm"}) std::remove((o.state_path + s).c_str());
  return r.partial_gangs == 0 && r.overcommits == 0 ? 0 : 1;
}

}  // namespace crosstrain::apps
