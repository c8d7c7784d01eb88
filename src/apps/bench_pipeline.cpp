#include "bench_pipeline.h"

#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <cstdio>

#include "crosstrain/comm/init.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/models/parallelize.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/parallel/pipeline.h"
#include "launcher.h"

namespace crosstrain::apps {
namespace {

using Clock = std::chrono::steady_clock;

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ",") + std::to_string(x);
  return s;
}

double all_reduce(comm::Communicator& c, double v, comm::ReduceOp op) {
  at::Tensor t = at::full({1}, v, at::kDouble);
  c.all_reduce(t, op)->wait();
  return t.item<double>();
}

// The last step's timeline of every stage as one Chrome trace (chrome://tracing, ui.perfetto.dev): the gaps
// in each stage's track are the bubble.
void write_trace(comm::Communicator& world, const BenchPipelineOptions& o, const parallel::PipelineRuntime& runtime,
                 parallel::ScheduleKind kind, int m) {
  const auto& events = runtime.timeline();
  const int64_t longest = static_cast<int64_t>(all_reduce(world, static_cast<double>(events.size()), comm::ReduceOp::Max));
  at::Tensor mine = at::full({longest, 5}, -1.0, at::kDouble);
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    mine[static_cast<int64_t>(i)].copy_(at::tensor({static_cast<double>(e.action.type), static_cast<double>(e.action.microbatch),
                                                   static_cast<double>(e.action.chunk), e.start_s, e.end_s}, at::kDouble));
  }
  at::Tensor all = at::empty({world.size() * longest, 5}, at::kDouble);
  world.all_gather(mine, all)->wait();
  if (world.rank() != 0) return;
  nlohmann::json trace = nlohmann::json::array();
  for (int r = 0; r < world.size(); ++r) {
    trace.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", r},
                     {"args", {{"name", "stage " + std::to_string(r)}}}});
    for (int64_t i = 0; i < longest; ++i) {
      auto row = all[r * longest + i];
      if (row[0].item<double>() < 0) break;
      auto type = static_cast<parallel::ActionType>(static_cast<int>(row[0].item<double>()));
      const int mb = static_cast<int>(row[1].item<double>()), chunk = static_cast<int>(row[2].item<double>());
      trace.push_back({{"name", std::string(parallel::to_string(type)) + " " + std::to_string(mb)},
                       {"cat", chunk == 0 ? "chunk0" : "chunk1"},
                       {"ph", "X"}, {"pid", 0}, {"tid", r},
                       {"ts", row[3].item<double>() * 1e6},
                       {"dur", (row[4].item<double>() - row[3].item<double>()) * 1e6},
                       {"args", {{"microbatch", mb}, {"chunk", chunk}}}});
    }
  }
  std::filesystem::create_directories(o.trace_dir);
  const std::string path = o.trace_dir + "/pipeline-" + parallel::to_string(kind) + "-p" + std::to_string(world.size()) +
                           "-m" + std::to_string(m) + ".json";
  std::ofstream(path) << nlohmann::json{{"traceEvents", trace}}.dump() << "\n";
}

// One (schedule, m) measurement on this rank; prints on rank 0.
void measure(comm::Communicator& world, const BenchPipelineOptions& o, parallel::ScheduleKind kind, int m) {
  const int p = world.size();
  if (p < 2) throw UsageError("bench pipeline: --stages must be at least 2 (a pipeline of one stage has no bubble)");
  models::GPTConfig config;
  config.n_layer = o.layers;
  config.n_head = o.heads;
  config.n_embd = o.width;
  config.block_size = o.context;
  config.vocab_size = 256;
  // The same composition as training: one pipeline stage per rank, this schedule and m micro-batches.
  parallel::ParallelConfig layout;
  layout.pp = p;
  layout.schedule = parallel::to_string(kind);
  const parallel::ParallelDims dims = models::gpt_dims(config, layout, m, p);
  const parallel::ScheduleSpec spec = dims.schedule_spec();
  parallel::Mesh mesh(world, dims.shape);
  auto model = models::parallelize(config, 1, dims, mesh, o.batch);
  int64_t param_bytes = 0;
  for (const auto& t : model->parameters()) param_bytes += t.numel() * 4;
  auto gen = at::detail::createCPUGenerator(5);
  for (int i = 0; i < m; ++i) {
    model->inputs[i] = torch::randint(0, 256, {o.batch, o.context}, gen);
    model->targets[i] = torch::randint(0, 256, {o.batch, o.context}, gen);
  }
  parallel::PipelineRuntime& runtime = *model->pipeline();
  auto sim = parallel::simulate(spec, parallel::build_schedule(spec));

  double makespan = 0, busy = 0;
  for (int step = 0; step <= o.steps; ++step) {  // step 0 warms up
    world.barrier()->wait();
    auto t0 = Clock::now();
    runtime.train_step();
    double local = std::chrono::duration<double>(Clock::now() - t0).count();
    double compute = 0;
    for (const auto& e : runtime.timeline())
      if (e.action.type == parallel::ActionType::Forward || e.action.type == parallel::ActionType::Backward ||
          e.action.type == parallel::ActionType::BackwardInput || e.action.type == parallel::ActionType::BackwardWeight)
        compute += e.end_s - e.start_s;
    for (auto& t : model->parameters()) t.mutable_grad() = at::Tensor();
    if (step == 0) continue;
    makespan += all_reduce(world, local, comm::ReduceOp::Max);
    busy += all_reduce(world, compute, comm::ReduceOp::Avg);
  }
  const double measured = (makespan - busy) / busy;
  if (!o.trace_dir.empty()) write_trace(world, o, runtime, kind, m);
  const double peak_rss = all_reduce(world, static_cast<double>(obs::peak_rss_bytes()), comm::ReduceOp::Max);
  const double max_params = all_reduce(world, static_cast<double>(param_bytes), comm::ReduceOp::Max);
  int peak = 0;
  for (int a : sim.peak_activations) peak = std::max(peak, a);
  if (world.rank() == 0) {
    std::printf("schedule=%s p=%d m=%d bubble_measured=%.3f bubble_theory=%.3f bubble_simulated=%.3f "
                "peak_inflight=%d activation_mb_per_microbatch=%.2f params_mb_per_rank=%.2f peak_rss_mb=%.0f\n",
                parallel::to_string(kind), p, m, measured, parallel::theoretical_bubble(spec), sim.bubble_fraction,
                peak, o.batch * o.context * o.width * 4.0 / (1 << 20), max_params / (1 << 20), peak_rss / (1 << 20));
    std::fflush(stdout);
  }
}

}  // namespace

int bench_pipeline(const BenchPipelineOptions& o, const std::vector<std::string>& relaunch_args) {
  LaunchEnv env = detect_launch_env(current_environment());
  if (env.source == LaunchSource::Single) {
    // One job per pipeline depth: the ranks are the stages.
    std::printf("# crosstrain bench pipeline: GPT %dL d%d T%d, %d sequences per micro-batch, %d timed steps; "
                "measured bubble = (step time - mean compute per rank) / mean compute\n",
                o.layers, o.width, o.context, o.batch, o.steps);
    std::fflush(stdout);
    for (int p : o.stages) {
      std::vector<std::string> args{"bench", "pipeline", "--stages", std::to_string(p),
                                    "--microbatches", join_ints(o.microbatches)};
      for (const auto& s : o.schedules) args.insert(args.end(), {"--schedule", s});
      args.insert(args.end(), {"--layers", std::to_string(o.layers), "--width", std::to_string(o.width),
                               "--context", std::to_string(o.context), "--batch", std::to_string(o.batch),
                               "--steps", std::to_string(o.steps)});
      if (!o.trace_dir.empty()) args.insert(args.end(), {"--trace", o.trace_dir});
      int rc = launch_self(p, args);
      if (rc != 0) return rc;
    }
    return 0;
  }
  limit_compute_threads(1);
  keep_freed_memory_for_reuse();
  auto world = comm::init_world(env, comm::CommConfig{});
  for (const auto& name : o.schedules) {
    auto kind = parallel::parse_schedule(name);
    for (int m : o.microbatches) {
      if (kind == parallel::ScheduleKind::Interleaved1F1B && (m % world->size() != 0 || world->size() < 2)) continue;
      measure(*world, o, kind, m);
    }
  }
  return 0;
}

}  // namespace crosstrain::apps
