#include "crosstrain/scheduler/bench.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/sim_executor.h"
#include "crosstrain/scheduler/state_store.h"

namespace crosstrain::scheduler {
namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

planner::DeviceType device(const char* name, double bf16_tflops, double memory_gb, double power_w, double price) {
  planner::DeviceType d;
  d.name = name;
  d.peak_flops = {{"fp32", bf16_tflops * 1e12 / 8}, {"bf16", bf16_tflops * 1e12}};
  d.memory_bytes = memory_gb * 1e9;
  d.memory_bandwidth_Bps = 2e12;
  d.power_w = power_w;
  d.gemm_efficiency = 0.6;
  d.price_per_hour = price;
  return d;
}

comm::Link link(double latency_s, double gbps) {
  comm::Link l;
  l.latency_s = latency_s;
  l.bandwidth_Bps = gbps * 1e9 / 8;
  return l;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5))];
}

// Runs passes, advancing the simulated clock, until every displaced job holds devices again, has ended, or could
// only run on the lost cluster (stranded: returned). Throws after a simulated week.
int wait_replaced(Scheduler& s, SimulatedExecutor& exec, const std::vector<int64_t>& displaced, double step_s) {
  for (double waited = 0; waited < 7 * 86400; waited += step_s) {
    int waiting = 0, stranded = 0;
    for (int64_t id : displaced) {
      const JobState st = s.job(id).state;
      if (holds_devices(st) || finished(st)) continue;
      ++waiting;
      stranded += !s.could_run(id);
    }
    if (waiting == stranded) return stranded;
    exec.advance(step_s);
    s.tick();
  }
  throw Error("bench scheduler: displaced jobs were not placed again within a simulated week");
}

}  // namespace

std::string SchedulerBenchResult::line() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "placements_per_s=%.0f decision_p95_ms=%.2f partial_gangs=%lld replace_after_loss_s=%.3f",
                placements_per_s, decision_p95_ms, static_cast<long long>(partial_gangs), replace_after_loss_s);
  return buf;
}

Registry bench_registry(int clusters, std::mt19937_64& rng) {
  if (clusters < 2 || clusters > 16) throw UsageError("bench scheduler: --clusters must be 2..16");
  const planner::DeviceType types[] = {device("h100", 989, 80, 700, 4.0), device("a100", 312, 80, 400, 2.0),
                                       device("l40s", 362, 48, 350, 1.0)};
  const int sizes[] = {32, 64, 128, 256};
  Registry r;
  r.set_default_link(link(0.04, 10));
  for (int i = 0; i < clusters; ++i) {
    const planner::DeviceType& d = types[rng() % 3];
    planner::ClusterSpec c;
    c.name = "c" + std::to_string(i) + "-" + d.name;
    c.device = d.name;
    c.devices_per_host = d.name == "l40s" ? 4 : 8;
    c.hosts = sizes[rng() % 4] / c.devices_per_host;
    c.host_link = link(3e-6, d.name == "l40s" ? 200 : 2400);
    c.cluster_link = link(6e-6, d.name == "l40s" ? 100 : 400);
    r.add_cluster(c, d);
  }
  const double gbps[] = {1, 10, 100};
  for (int a = 0; a < clusters; ++a)
    for (int b = a + 1; b < clusters; ++b)
      r.set_link(r.info(a).name, r.info(b).name, link(0.01 + 0.01 * static_cast<double>(rng() % 5), gbps[rng() % 3]));
  return r;
}

JobSpec bench_job(int index, std::mt19937_64& rng) {
  const char* models[] = {"gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "llama-7b"};
  const int ranks[] = {8, 8, 8, 16, 16, 32, 32, 64, 128, 256};
  JobSpec j;
  j.model = planner::model_preset(models[rng() % 5]);
  j.name = "job" + std::to_string(index) + "-" + j.model.name;
  j.ranks = ranks[rng() % 10];
  j.global_batch = 512;
  j.steps = 200 + static_cast<int64_t>(rng() % 1800);
  j.checkpoint_every = 50;
  const int qos = static_cast<int>(rng() % 10);
  if (qos == 0) j.qos.max_wan_gbps = 0;        // must stay in one cluster
  if (qos == 1) j.qos.max_wan_gbps = 2;        // may span only slowly (DiLoCo)
  if (qos == 2) j.qos.deadline_s = 600;        // short deadline: rejected when it cannot be met
  if (qos == 3) j.qos.budget = 50;             // small budget
  return j;
}

SchedulerBenchResult run_scheduler_bench(const SchedulerBenchOptions& o) {
  if (o.state_path.empty()) throw UsageError("bench scheduler: give the state file (--state PATH)");
  if (o.jobs < 2) throw UsageError("bench scheduler: --jobs must be at least 2");
  for (const char* suffix : {"", "-wal", "-shm"}) std::remove((o.state_path + suffix).c_str());
  std::mt19937_64 rng(o.seed);
  Registry registry = bench_registry(o.clusters, rng);
  SimulatedExecutor exec = SimulatedExecutor::for_registry(registry);
  StateStore store(o.state_path, {o.synchronous_full});
  SchedulerOptions so;
  so.backfill_passes = 50;
  SchedulerBenchResult r;
  r.jobs = o.jobs, r.clusters = registry.size(), r.devices = registry.capacity_total();
  std::vector<JobSpec> specs;
  for (int i = 0; i < o.jobs; ++i) specs.push_back(bench_job(i, rng));

  Scheduler s(std::move(registry), store, exec, so, [&exec] { return exec.now(); });
  const double t0 = wall_s();
  for (int i = 0; i < o.jobs; ++i) {
    exec.advance(o.interarrival_s);
    s.submit(specs[i]);
    s.tick();
    if (i != o.jobs / 2) continue;
    // Lose the cluster that runs the most jobs; time until each of them holds devices again.
    std::map<std::string, int> on;
    for (int64_t id : s.active())
      for (const auto& sh : s.job(id).placement->shares) ++on[sh.cluster];
    if (on.empty()) continue;
    r.lost_cluster = std::max_element(on.begin(), on.end(), [](auto& a, auto& b) { return a.second < b.second; })->first;
    std::vector<int64_t> displaced;
    for (int64_t id : s.active())
      if (s.job(id).placement->on(r.lost_cluster)) displaced.push_back(id);
    const double lost_at = wall_s(), sim_at = exec.now();
    exec.lose(r.lost_cluster);
    s.tick();  // the poll sees the loss, displaces the jobs and places them again
    r.stranded = wait_replaced(s, exec, displaced, o.interarrival_s);
    r.replace_after_loss_s = wall_s() - lost_at;
    r.replace_wait_sim_s = exec.now() - sim_at;
    r.displaced = static_cast<int>(displaced.size());
  }
  // Drain; jobs that only the lost cluster could hold stay queued (it may come back), so stop when nothing runs.
  for (int idle = 0; idle < 3 && (s.queued() > 0 || !s.active().empty());) {
    exec.advance(60);
    s.tick();
    idle = s.active().empty() ? idle + 1 : 0;
  }
  r.wall_s = wall_s() - t0;
  const SchedulerStats& st = s.stats();
  r.placements = st.decisions;
  r.rejected = st.rejected;
  for (const JobRecord* j : s.jobs()) {
    r.done += j->state == JobState::Done;
    r.failed += j->state == JobState::Failed;
    r.queued_at_end += j->state == JobState::Queued;
  }
  // A "placed" event reads "east:8 + west:8 [LAYOUT] SYNC (why each cluster)" (scheduler.cpp): the sync's word
  // follows the layout's bracket.
  const std::string diloco = std::string("] ") + planner::to_string(planner::LayoutSync::DiLoCo);
  for (const EventRow& e : store.events())
    if (e.kind == "placed") {
      const std::string where = e.detail.substr(0, e.detail.find(" ("));
      r.spanning += where.find(" + ") != std::string::npos;
      r.diloco += where.size() >= diloco.size() &&
                  where.compare(where.size() - diloco.size(), diloco.size(), diloco) == 0;
    }
  r.placements_per_s = r.placements / r.wall_s;
  r.decision_p50_ms = percentile(st.decision_s, 0.5) * 1e3;
  r.decision_p95_ms = percentile(st.decision_s, 0.95) * 1e3;
  r.decision_max_ms = percentile(st.decision_s, 1.0) * 1e3;
  r.partial_gangs = exec.partial_gangs();
  r.overcommits = exec.overcommits();
  return r;
}

}  // namespace crosstrain::scheduler
