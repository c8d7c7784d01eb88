#include "plan_cmd.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>

#include <fstream>

#include "crosstrain/core/error.h"
#include "plan_calibrate.h"
#include "crosstrain/parallel/parallel_dims.h"
#include "crosstrain/planner/search.h"
#include "crosstrain/train/sync_mode.h"
#include "crosstrain/train/config.h"

namespace crosstrain::apps {
namespace {

using planner::Estimate;
using planner::Layout;

bool is_recipe(const std::string& model) {
  return model.size() > 5 && model.compare(model.size() - 5, 5, ".toml") == 0;
}

Layout layout_of_recipe(const train::Config& c, int world) {
  const auto dims = parallel::ParallelDims::resolve(c.parallel, c.train.micro_batches, world, c.model.n_layer);
  Layout l;
  l.dp = dims.dp(), l.tp = dims.tp(), l.pp = dims.pp();
  l.zero = dims.zero, l.schedule = dims.schedule, l.chunks = static_cast<int>(dims.chunks);
  l.microbatches = static_cast<int>(dims.microbatches);
  l.sequence_parallel = dims.sequence_parallel;
  if (c.train.global_batch % (l.dp * l.microbatches) != 0)
    throw UsageError("train.global_batch = " + std::to_string(c.train.global_batch) + " does not split into dp=" +
                     std::to_string(l.dp) + " x " + std::to_string(l.microbatches) + " micro-batches");
  l.micro_batch = static_cast<int>(c.train.global_batch / (l.dp * l.microbatches));
  for (size_t i = 0; i + 1 < dims.bounds.size(); ++i) l.stage_layers.push_back(dims.bounds[i + 1] - dims.bounds[i]);
  l.precision = c.train.precision;
  l.bucket_mb = c.parallel.bucket_mb;
  l.recompute = c.train.recompute;
  const train::SyncMode mode = train::sync_traits(c.sync).mode;
  if (mode == train::SyncMode::Sync) {
    l.sync = c.sync.hierarchical ? planner::LayoutSync::Hierarchical : planner::LayoutSync::Sync;
  } else if (mode == train::SyncMode::DiLoCo) {
    l.sync = planner::LayoutSync::DiLoCo;
    l.inner_steps = static_cast<int>(c.sync.inner_steps);
  } else {
    throw UsageError(std::string("sync.mode = ") + train::to_string(mode) +
                     ": the planner models sync (flat or hierarchical) and diloco; set one of them to plan");
  }
  l.cluster_batch = train::parse_cluster_batch(c.sync.cluster_batch);  // the trainer's own reading of the key
  return l;
}

}  // namespace

PlanInputs resolve_plan_inputs(const PlanCommand& cmd) {
  PlanInputs in;
  if (cmd.cluster.empty()) throw UsageError("give a cluster file: crosstrain plan MODEL CLUSTER (see clusters/)");
  in.cluster = planner::load_cluster(cmd.cluster);
  if (is_recipe(cmd.model)) {
    const train::Config c = train::load_config(cmd.model, cmd.sets);
    in.model = planner::from_gpt_config(c.model, c.run.name);
    const int world = cmd.nproc > 0 ? cmd.nproc : in.cluster.total_devices();
    in.layout = layout_of_recipe(c, world);
    in.global_batch = c.train.global_batch;
    in.has_layout = !cmd.search;
    return in;
  }
  if (!cmd.sets.empty()) throw UsageError("--set applies to recipes; for a preset give --layout and --global-batch");
  in.model = planner::model_preset(cmd.model);
  in.has_layout = !cmd.layout.empty();
  if (in.has_layout) {
    in.layout = planner::parse_layout(cmd.layout);
    if (in.layout.dp == 0) {
      const int n = cmd.devices > 0 ? cmd.devices : in.cluster.total_devices();
      in.layout.dp = std::max(1, n / (in.layout.tp * in.layout.pp));
    }
    if (cmd.global_batch > 0) {
      const int64_t per = in.layout.dp * in.layout.micro_batch;
      if (cmd.global_batch % per) throw UsageError("--global-batch must be a multiple of dp x mb = " + std::to_string(per));
      in.layout.microbatches = static_cast<int>(cmd.global_batch / per);
    }
  }
  in.global_batch = cmd.global_batch > 0 ? cmd.global_batch : in.has_layout ? in.layout.global_batch() : 0;
  if (!in.has_layout && !cmd.search)
    throw UsageError("give --layout \"dp=.. tp=.. pp=.. m=..\" or --search --global-batch N for a preset model");
  return in;
}

namespace {

std::string si(double v, const char* unit) {
  const char* prefixes[] = {"", "k", "M", "G", "T", "P", "E", "Z", "Y"};
  int i = 0;
  while (std::fabs(v) >= 1000 && i < 8) v /= 1000, ++i;
  char b[64];
  std::snprintf(b, sizeof b, "%.3g %s%s", v, prefixes[i], unit);
  return b;
}

std::string duration(double s) {
  char b[64];
  if (s < 120) std::snprintf(b, sizeof b, "%.3g s", s);
  else if (s < 7200) std::snprintf(b, sizeof b, "%.1f min", s / 60);
  else if (s < 2 * 86400) std::snprintf(b, sizeof b, "%.1f h", s / 3600);
  else if (s < 2 * 365.25 * 86400) std::snprintf(b, sizeof b, "%.1f days", s / 86400);
  else std::snprintf(b, sizeof b, "%.1f years", s / (365.25 * 86400));
  return b;
}

std::string pct(double part, double whole) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f%%", whole > 0 ? 100 * part / whole : 0.0);
  return b;
}

// The seeds' coarse figures: 6ND and 8ND, one device at peak, the cluster at 45% of peak, fp32 parameters.
void print_totals(const PlanInputs& in, double tokens) {
  const auto& first = in.cluster.clusters.front();
  const planner::DeviceType& dev = in.cluster.device_of(first);
  const double peak = dev.peak("bf16"), n = in.cluster.total_devices();
  const double f6 = in.model.training_flops(tokens), f8 = in.model.training_flops_recompute(tokens);
  std::printf("totals    %s tokens: 6ND = %sFLOP; 8ND (full recompute) = %sFLOP\n", si(tokens, "").c_str(),
              si(f6, "").c_str(), si(f8, "").c_str());
  std::printf("          one %s at its bf16 peak (%s): %s (6ND)\n", dev.name.c_str(), si(peak, "FLOP/s").c_str(),
              duration(f6 / peak).c_str());
  std::printf("          %.0f x %s at 45%% of peak: %s (8ND), %s (6ND)\n", n, dev.name.c_str(),
              duration(f8 / (n * 0.45 * peak)).c_str(), duration(f6 / (n * 0.45 * peak)).c_str());
  std::printf("          parameters: %s at 4 bytes (fp32), %s at 2; one %s holds %s\n",
              si(in.model.parameters() * 4, "B").c_str(), si(in.model.parameters() * 2, "B").c_str(), dev.name.c_str(),
              si(dev.memory_bytes, "B").c_str());
}

void print_estimate(const Estimate& e, double tokens, const std::string& currency) {
  const auto& t = e.time;
  const auto& m = e.memory;
  std::printf("layout    %s\n", e.layout.describe().c_str());
  std::printf("step      %s: compute %s (%s), tp %s, pp bubble %s, pp transfer %s, dp %s, wan %s, optimizer %s\n",
              duration(t.step_s).c_str(), duration(t.compute_s).c_str(), pct(t.compute_s, t.step_s).c_str(),
              duration(t.tp_exposed_s).c_str(), duration(t.pp_bubble_s).c_str(), duration(t.pp_transfer_s).c_str(),
              duration(t.dp_exposed_s).c_str(), duration(t.wan_exposed_s).c_str(), duration(t.optimizer_s).c_str());
  std::printf("speed     %s tokens/s; %s per device (hardware, recompute included); MFU %.1f%%\n",
              si(e.tokens_per_s, "").c_str(), si(e.flops_per_device, "FLOP/s").c_str(), 100 * e.mfu);
  std::printf("memory    per device (most loaded): parameters %s, gradients %s, optimizer %s, activations %s "
              "(%s without recompute; %d micro-batches in flight), buffers %s: %s of %s%s\n",
              si(m.parameters_bytes, "B").c_str(), si(m.gradients_bytes, "B").c_str(), si(m.optimizer_bytes, "B").c_str(),
              si(m.activations_bytes, "B").c_str(), si(m.activations_no_recompute_bytes, "B").c_str(),
              m.in_flight_microbatches, si(m.buffers_bytes, "B").c_str(), si(m.total_bytes, "B").c_str(),
              si(m.capacity_bytes, "B").c_str(), m.fits ? ": fits" : ": DOES NOT FIT");
  if (tokens > 0)
    std::printf("train     %s tokens: %s, %s device-hours, cost %.4g %s, energy %s\n", si(tokens, "").c_str(),
                duration(e.time_to_train_s).c_str(), si(e.device_hours, "").c_str(), e.cost, currency.c_str(),
                si(e.energy_j / 3600, "Wh").c_str());
  const double comm = t.tp_exposed_s + t.pp_transfer_s + t.dp_exposed_s + t.wan_exposed_s;
  std::printf("wall      %s (compute %s of the step, exposed communication %s, bubble %s); scaling efficiency %.2f\n",
              e.wall.c_str(), pct(t.compute_s, t.step_s).c_str(), pct(comm, t.step_s).c_str(),
              pct(t.pp_bubble_s, t.step_s).c_str(), e.scaling_efficiency);
  std::string sets;
  for (const auto& o : e.layout.train_overrides())  // quoted for the shell where the value holds a TOML string
    sets += o.find('"') == std::string::npos ? " --set " + o : " --set '" + o + "'";
  std::printf("train it  crosstrain train RECIPE --nproc %d%s\n", e.layout.devices(), sets.c_str());
}

nlohmann::json to_json(const Estimate& e, const std::string& currency) {
  const auto& t = e.time;
  const auto& m = e.memory;
  return {{"layout", e.layout.describe()},
          {"overrides", e.layout.train_overrides()},
          {"step_s", t.step_s},
          {"time", {{"compute_s", t.compute_s}, {"tp_exposed_s", t.tp_exposed_s}, {"pp_bubble_s", t.pp_bubble_s},
                    {"pp_transfer_s", t.pp_transfer_s}, {"dp_exposed_s", t.dp_exposed_s},
                    {"wan_exposed_s", t.wan_exposed_s}, {"optimizer_s", t.optimizer_s}}},
          {"memory", {{"parameters_bytes", m.parameters_bytes}, {"gradients_bytes", m.gradients_bytes},
                      {"optimizer_bytes", m.optimizer_bytes}, {"activations_bytes", m.activations_bytes},
                      {"activations_no_recompute_bytes", m.activations_no_recompute_bytes},
                      {"in_flight_microbatches", m.in_flight_microbatches}, {"buffers_bytes", m.buffers_bytes},
                      {"total_bytes", m.total_bytes}, {"capacity_bytes", m.capacity_bytes}, {"fits", m.fits}}},
          {"tokens_per_step", e.tokens_per_step},
          {"tokens_per_s", e.tokens_per_s},
          {"flops_per_device", e.flops_per_device},
          {"mfu", e.mfu},
          {"time_to_train_s", e.time_to_train_s},
          {"device_hours", e.device_hours},
          {"cost", e.cost},
          {"currency", currency},
          {"energy_j", e.energy_j},
          {"scaling_efficiency", e.scaling_efficiency},
          {"wall", e.wall}};
}

int run_search(const PlanCommand& cmd, const PlanInputs& in) {
  planner::SearchOptions o;
  o.global_batch = in.global_batch;
  o.devices = cmd.devices > 0 ? cmd.devices : (is_recipe(cmd.model) && cmd.nproc > 0 ? cmd.nproc : 0);
  o.rank_by = cmd.rank_by;
  o.top = cmd.top;
  o.tokens = cmd.tokens;
  if (is_recipe(cmd.model)) o.precisions = {in.layout.precision};
  const planner::SearchResult r = planner::search_layouts(in.model, in.cluster, o);
  if (cmd.json) {
    nlohmann::json best = nlohmann::json::array();
    for (const auto& e : r.best) best.push_back(to_json(e, in.cluster.currency));
    std::cout << nlohmann::json{{"candidates", r.candidates}, {"pruned_by_memory", r.pruned_by_memory},
                                {"feasible", r.feasible}, {"seconds", r.seconds},
                                {"candidates_per_s", r.candidates_per_s}, {"best", best}}
                     .dump(2)
              << "\n";
    return r.best.empty() ? 1 : 0;
  }
  std::printf("search    %lld candidates in %.3g s (%s candidates/s): %lld pruned by memory, %lld feasible\n",
              static_cast<long long>(r.candidates), r.seconds, si(r.candidates_per_s, "").c_str(),
              static_cast<long long>(r.pruned_by_memory), static_cast<long long>(r.feasible));
  if (r.best.empty()) {
    std::printf("no layout fits: more devices, ZeRO-3, recompute or a smaller micro-batch would be needed\n");
    return 1;
  }
  for (size_t i = 0; i < r.best.size(); ++i) {
    std::printf("\n#%zu\n", i + 1);
    print_estimate(r.best[i], cmd.tokens, in.cluster.currency);
  }
  return 0;
}

}  // namespace

namespace {

int run_calibration(const PlanCommand& cmd) {
  if (cmd.out.empty()) throw UsageError("--calibrate needs --out FILE (the cluster file to write)");
  CalibrateOptions o;
  o.out_path = cmd.out;
  std::fprintf(stderr, "calibrating this host (GEMM rates, memory bandwidth, operator overhead, links)...\n");
  const planner::ClusterFile host = calibrate_this_host(o);
  std::ofstream out(cmd.out);
  if (!(out << planner::to_toml(host))) throw UsageError("cannot write the cluster file '" + cmd.out + "'");
  std::printf("wrote %s: %d devices (%s)\n", cmd.out.c_str(), host.total_devices(), host.clusters.front().name.c_str());
  return 0;
}

}  // namespace

int plan_command(const PlanCommand& cmd) {
  if (cmd.calibrate) return run_calibration(cmd);
  if (cmd.model.empty()) throw UsageError("give a model and a cluster file: crosstrain plan MODEL CLUSTER");
  const PlanInputs in = resolve_plan_inputs(cmd);
  if (!cmd.json) {
    std::printf("model     %s\n", in.model.describe().c_str());
    std::printf("cluster   %s: %d devices in %zu cluster(s)\n", in.cluster.name.c_str(), in.cluster.total_devices(),
                in.cluster.clusters.size());
    if (cmd.tokens > 0) print_totals(in, cmd.tokens);
  }
  if (cmd.search) return run_search(cmd, in);
  planner::EstimateOptions o;
  o.tokens = cmd.tokens;
  const Estimate e = planner::estimate(in.model, in.cluster, in.layout, o);
  if (cmd.json) {
    std::cout << to_json(e, in.cluster.currency).dump(2) << "\n";
  } else {
    print_estimate(e, cmd.tokens, in.cluster.currency);
  }
  return 0;
}

}  // namespace crosstrain::apps
