#include "crosstrain/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crosstrain/comm/algorithm_communicator.h"
#include "crosstrain/comm/compression.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/parallel/grad_reducer.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/parallel/pipeline.h"
#include "crosstrain/parallel/zero.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/lr_schedule.h"
#include "crosstrain/train/stop_vote.h"
#include "crosstrain/train/sync_strategy.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using parallel::Axis;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Single-thread matmul throughput: the denominator of MFU on a CPU, where no datasheet peak applies.
double measure_peak_flops() {
  torch::NoGradGuard no_grad;
  const int64_t n = 512;
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::matmul(a, b);
  int iters = 0;
  auto start = Clock::now();
  while (seconds_since(start) < 0.3 || iters < 3) {
    auto c = torch::matmul(a, b);
    ++iters;
  }
  return 2.0 * n * n * n * iters / seconds_since(start);
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

struct Layout {
  parallel::MeshShape shape;
  int64_t microbatches = 1;  // per data-parallel rank and step
  int64_t chunks = 1;
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  std::vector<int64_t> bounds;  // first block of each virtual stage, then the end
};

Layout resolve_layout(const Config& c, int world) {
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  Layout l;
  need(c.parallel.pp >= 1 && c.parallel.tp >= 1 && c.parallel.dp >= 0,
       "parallel.pp and parallel.tp must be at least 1 and parallel.dp at least 0");
  l.shape.pp = static_cast<int>(c.parallel.pp);
  l.shape.tp = static_cast<int>(c.parallel.tp);
  l.shape.dp = c.parallel.dp > 0 ? static_cast<int>(c.parallel.dp) : std::max(1, world / (l.shape.pp * l.shape.tp));
  l.shape.check(world);
  l.schedule = parallel::parse_schedule(c.parallel.schedule);
  l.chunks = c.parallel.chunks > 0 ? c.parallel.chunks : (l.schedule == parallel::ScheduleKind::Interleaved1F1B ? 2 : 1);
  if (l.shape.pp > 1)
    l.microbatches = c.parallel.microbatches > 0 ? c.parallel.microbatches : std::max<int64_t>(c.train.micro_batches, l.shape.pp);
  else
    l.microbatches = c.parallel.microbatches > 0 ? c.parallel.microbatches : c.train.micro_batches;
  need(!c.parallel.sequence_parallel || l.shape.tp > 1, "parallel.sequence_parallel needs parallel.tp > 1");
  models::check_parallel_plan(c.model, l.shape.tp, c.parallel.sequence_parallel,
                              static_cast<int>(l.shape.pp * l.chunks));
  if (l.shape.pp > 1)
    parallel::validate(parallel::ScheduleSpec{l.schedule, l.shape.pp, static_cast<int>(l.microbatches),
                                              static_cast<int>(l.chunks)});
  const int virtual_stages = static_cast<int>(l.shape.pp * l.chunks);
  if (c.parallel.stage_layers.empty()) {
    l.bounds = models::partition_gpt(c.model, virtual_stages);
  } else {
    // Given explicitly: blocks per virtual stage.
    std::vector<int64_t> counts;
    std::stringstream in(c.parallel.stage_layers);
    for (std::string item; std::getline(in, item, ',');) {
      try {
        counts.push_back(std::stoll(item));
      } catch (const std::exception&) {
        need(false, "parallel.stage_layers = '" + c.parallel.stage_layers + "' must be a list like \"3,3,2\"");
      }
    }
    int64_t total = 0;
    for (auto n : counts) total += n;
    need(static_cast<int>(counts.size()) == virtual_stages &&
             std::all_of(counts.begin(), counts.end(), [](int64_t n) { return n >= 1; }) && total == c.model.n_layer,
         "parallel.stage_layers = '" + c.parallel.stage_layers + "' must give " + std::to_string(virtual_stages) +
             " positive block counts (pp x chunks) adding up to model.n_layer = " + std::to_string(c.model.n_layer));
    l.bounds = {0};
    for (auto n : counts) l.bounds.push_back(l.bounds.back() + n);
  }
  return l;
}

void validate(const Config& c, int world) {
  c.model.validate();
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  need(c.train.steps >= 1, "train.steps must be at least 1");
  need(c.train.micro_batches >= 1, "train.micro_batches must be at least 1");
  need(c.train.lr > 0 && c.train.min_lr >= 0, "train.lr must be positive and train.min_lr non-negative");
  need(c.train.threads_per_rank >= 1, "train.threads_per_rank must be at least 1");
  need(c.run.log_every >= 1, "run.log_every must be at least 1");
  if (c.comm.compression != "none") comm::make_codec(c.comm.compression);  // throws on a bad spec
  comm::validate(comm::AlgorithmConfig{c.comm.algo, c.comm.topology});
  need(c.train.keep_checkpoints >= 0, "train.keep_checkpoints must be 0 (keep all) or more");
  Layout l = resolve_layout(c, world);
  need(c.parallel.zero >= 0 && c.parallel.zero <= 3,
       "parallel.zero = " + std::to_string(c.parallel.zero) + ": use 0 (plain data parallel), 1, 2 or 3");
  need(c.parallel.zero < 3 || l.shape.pp == 1,
       "parallel.zero = 3 gathers parameters layer by layer and needs parallel.pp = 1; use parallel.zero = 1 or 2 with pipelines");
  check_sync_config(c.sync, l.shape.dp, l.shape.pp, l.shape.tp, c.parallel.zero);  // [sync]
  need(c.train.precision == "fp32" || c.train.precision == "bf16",
       "train.precision = '" + c.train.precision + "': use \"fp32\" or \"bf16\"");
  need(c.train.precision == "fp32" || (c.parallel.zero >= 1 && l.shape.pp == 1),
       "train.precision = \"bf16\" keeps fp32 master weights in ZeRO's sharded optimizer: set parallel.zero = 1, 2 or 3 "
       "(and parallel.pp = 1)");
  need(c.parallel.zero == 0 || c.comm.compression == "none",
       "comm.compression applies to plain data parallel; set parallel.zero = 0 or comm.compression = \"none\"");
  const int64_t dp = l.shape.dp;
  need(c.train.global_batch % (dp * l.microbatches) == 0,
       "train.global_batch = " + std::to_string(c.train.global_batch) + " is not divisible by " + std::to_string(dp) +
           " data-parallel ranks x " + std::to_string(l.microbatches) + " micro-batches; use a multiple of " +
           std::to_string(dp * l.microbatches));
  need(c.model.vocab_size >= 256 || c.data.format == "bin",
       "model.vocab_size must be at least 256 for byte-level text");
}

}  // namespace

void check_resume_step(const std::string& checkpoint, int64_t checkpoint_step, int64_t steps) {
  if (checkpoint_step > steps)
    throw UsageError("--resume: checkpoint " + checkpoint + " is at step " + std::to_string(checkpoint_step) +
                     " but train.steps = " + std::to_string(steps) + "; set train.steps to " +
                     std::to_string(checkpoint_step) + " or more to continue this run (nothing was changed)");
}

void check_config(const Config& config, int world) {
  validate(config, world);
  if (!config.data.path.empty()) data::check_source(config.data);
}

struct Trainer::State {
  Config config;
  comm::Communicator& world;
  State(Config c, comm::Communicator& w) : config(std::move(c)), world(w) {}
};

Trainer::Trainer(Config config, comm::Communicator& world) : s_(std::make_unique<State>(std::move(config), world)) {
  validate(s_->config, world.size());
}

Trainer::~Trainer() = default;

TrainResult Trainer::run(const TrainOptions& options) {
  const Config& c = s_->config;
  comm::Communicator& world = s_->world;
  const bool leader = world.rank() == 0;
  const bool talk = leader && !options.quiet;
  limit_compute_threads(static_cast<int>(c.train.threads_per_rank));
  keep_freed_memory_for_reuse();

  const Layout layout = resolve_layout(c, world.size());
  parallel::Mesh mesh(world, layout.shape);
  const int dp = layout.shape.dp, pp = layout.shape.pp, tp = layout.shape.tp;
  const int pp_index = mesh.index(Axis::PP), tp_index = mesh.index(Axis::TP), dp_index = mesh.index(Axis::DP);
  const int64_t M = layout.microbatches;
  const int virtual_stages = static_cast<int>(pp * layout.chunks);

  // The full model from the seed, then this rank's shards of its chunks: every layout starts identical.
  models::GPT full(c.model, c.run.seed);
  const auto& bounds = layout.bounds;
  models::TensorParallelContext tp_ctx{mesh.group(Axis::TP), tp_index, tp, c.parallel.sequence_parallel};
  std::vector<models::GPTStage> chunks;
  std::map<std::string, torch::Tensor> shards;  // every parameter of this rank by plain name
  for (int64_t k = 0; k < layout.chunks; ++k) {
    const int vs = static_cast<int>(k * pp + pp_index);
    models::StageSpec spec{bounds[vs], bounds[vs + 1], vs == 0, vs == virtual_stages - 1};
    chunks.emplace_back(c.model, spec, tp_ctx, full);
    for (const auto& [name, t] : chunks.back()->named_shards()) shards[name] = t;
  }
  std::map<std::string, std::vector<int64_t>> global_shapes;  // for checkpoints: every parameter, unsplit
  for (const auto& item : full->named_parameters()) global_shapes[item.key()] = item.value().sizes().vec();
  const bool sampling = leader && c.train.sample_tokens > 0 && pp == 1 && tp == 1;
  // [sync] How replicas agree (sync.mode, docs/wan-training.md): builds the cluster groups; the gradient
  // all-reduce below runs over the strategy's group (all replicas, or one cluster, or none).
  SyncSetup sync_setup;
  sync_setup.config = c.sync;
  sync_setup.dp = mesh.group(Axis::DP);
  sync_setup.dp_index = dp_index;
  sync_setup.dp_size = dp;
  sync_setup.world_rank = world.rank();
  for (const auto& [name, t] : shards) sync_setup.parameters.push_back(t);
  sync_setup.steps = c.train.steps;
  sync_setup.cluster_hint = cluster_of_this_node(c.sync.topology);
  sync_setup.timeout = world.timeout();
  std::unique_ptr<SyncStrategy> sync_strategy = make_sync_strategy(std::move(sync_setup));
  double sync_blocked_s = 0, compute_s = 0;  // [sync] for utilization
  if (!sampling) full = models::GPT(nullptr);

  // The optimizer: torch's AdamW over whole replicas (plain data parallel, with the bucketed all-reduce), or
  // ZeRO's sharded AdamW, which is its own gradient reducer.
  const int zero_stage = static_cast<int>(c.parallel.zero);
  std::unique_ptr<torch::optim::AdamW> adamw;
  std::unique_ptr<parallel::BucketedAllReduce> bucketed;
  std::unique_ptr<parallel::ZeroOptimizer> zero;
  std::vector<std::vector<std::string>> unit_params;  // ZeRO: parameter names of each unit
  if (zero_stage == 0) {
    std::vector<torch::Tensor> decay, no_decay, all_params;
    for (auto& chunk : chunks)
      for (auto& p : chunk->parameters()) {
        (p.dim() >= 2 ? decay : no_decay).push_back(p);
        all_params.push_back(p);
      }
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(c.train.lr).betas({c.train.beta1, c.train.beta2}).eps(c.train.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options(c.train.weight_decay));
    if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
    adamw = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(c.train.lr));
    parallel::BucketConfig buckets;
    buckets.bucket_bytes = static_cast<int64_t>(c.parallel.bucket_mb * (1 << 20));
    buckets.compression = c.comm.compression;
    bucketed = std::make_unique<parallel::BucketedAllReduce>(all_params, sync_strategy->gradient_group(), buckets);
  } else {
    std::vector<std::vector<parallel::ZeroParam>> units;
    for (auto& chunk : chunks)
      for (const auto& names : chunk->unit_names()) {
        unit_params.push_back(names);
        units.emplace_back();
        for (const auto& name : names) units.back().push_back({shards.at(name), shards.at(name).dim() >= 2});
      }
    parallel::ZeroConfig zc;
    zc.stage = zero_stage;
    zc.adam = {c.train.lr, c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
    zc.dtype = c.train.precision == "bf16" ? at::kBFloat16 : at::kFloat;
    zero = std::make_unique<parallel::ZeroOptimizer>(std::move(units), mesh.group(Axis::DP), zc);
    if (zero_stage == 3) chunks[0]->set_unit_hooks(zero.get());
  }
  parallel::GradReducer& reducer = zero ? static_cast<parallel::GradReducer&>(*zero) : *bucketed;
  // Bytes of model state this rank holds: parameters, gradients, optimizer state.
  auto model_state_bytes = [&]() {
    if (zero) return zero->memory();
    parallel::ModelStateBytes m;
    for (const auto& [name, t] : shards) m.parameters += t.numel() * static_cast<int64_t>(t.element_size());
    m.gradients = reducer.stats().bytes;
    for (const auto& [key, st] : adamw->state()) {
      auto& a = static_cast<torch::optim::AdamWParamState&>(*st);
      for (const auto& t : {a.exp_avg(), a.exp_avg_sq()})
        if (t.defined()) m.optimizer += t.numel() * static_cast<int64_t>(t.element_size());
    }
    return m;
  };
  std::vector<torch::Tensor> partial_grads;  // sequence parallel: summed over the tensor-parallel group
  for (auto& chunk : chunks)
    for (auto& p : chunk->partial_gradient_parameters()) partial_grads.push_back(p);

  data::Splits splits = data::load_dataset(c.data, c.model.block_size);
  if (talk && !splits.warning.empty()) std::fprintf(stderr, "crosstrain: warning: %s\n", splits.warning.c_str());
  if (static_cast<int64_t>(splits.train.max_token()) >= c.model.vocab_size)
    throw UsageError("data '" + c.data.path + "' holds token " + std::to_string(splits.train.max_token()) +
                     " but model.vocab_size is " + std::to_string(c.model.vocab_size));
  // Every rank of a data-parallel replica (all its stages and tensor-parallel ranks) reads the same batch.
  data::DistributedSampler sampler(c.run.seed, static_cast<int64_t>(splits.train.size()), c.model.block_size,
                                   c.train.global_batch, dp_index, dp, static_cast<int>(M));
  const int64_t local_batch = sampler.local_micro_batch();

  // The micro-batches of the step being run (the pipeline callbacks read them).
  std::vector<torch::Tensor> inputs(M), targets(M);
  auto load_batches = [&](const data::TokenStream& stream, auto&& offsets_of) {
    for (int64_t m = 0; m < M; ++m) data::make_batch(stream, offsets_of(m), c.model.block_size, inputs[m], targets[m]);
  };

  std::unique_ptr<parallel::PipelineRuntime> pipeline;
  if (pp > 1) {
    parallel::PipelineModel model;
    model.forward = [&](int chunk, int mb, const at::Tensor& input) {
      return chunks[chunk]->pipeline_forward(input, inputs[mb], targets[mb], 1.0 / static_cast<double>(M));
    };
    model.parameters = [&](int chunk) { return chunks[chunk]->parameters(); };
    const int64_t seq = c.parallel.sequence_parallel ? c.model.block_size / tp : c.model.block_size;
    model.activation_shape = {local_batch, seq, c.model.n_embd};
    pipeline = std::make_unique<parallel::PipelineRuntime>(
        parallel::ScheduleSpec{layout.schedule, pp, static_cast<int>(M), static_cast<int>(layout.chunks)},
        mesh.group(Axis::PP), pp_index, model);
  }

  // The loss of the global batch, on every rank: the last stage's tensor-parallel rank 0 of each replica
  // contributes its micro-batch sum; the sum over the world divided by dp is the mean over replicas.
  auto global_mean = [&](double local_sum, bool contributes) {
    at::Tensor t = at::full({1}, contributes ? local_sum : 0.0, at::kDouble);
    world.all_reduce(t, comm::ReduceOp::Sum)->wait();
    return t.item<double>() / dp;
  };
  const bool last_stage = pp_index == pp - 1;

  auto run_pipeline_or_loop = [&](bool training) -> double {
    double loss = 0;
    if (pipeline) {
      loss = training ? pipeline->train_step() : pipeline->eval_step();
      return global_mean(loss, last_stage && tp_index == 0);
    }
    auto& stage = chunks[0];
    for (int64_t m = 0; m < M; ++m) {
      const bool sync = m == M - 1;
      reducer.set_sync(sync);
      auto l = stage->loss(inputs[m], targets[m]) / static_cast<double>(M);
      loss += l.item<double>();
      if (!training) continue;
      // The loss rides with the gradients: averaged over the data-parallel ranks in the same collective.
      if (sync) reducer.set_side_value(0, loss);
      l.backward();
    }
    if (!training) return global_mean(loss, tp_index == 0);
    reducer.finish();
    return dp > 1 ? reducer.side_value(0) : loss;
  };

  ModelStateRefs state_refs;
  state_refs.parameters = &shards;
  state_refs.global_shapes = global_shapes;
  state_refs.adamw = adamw.get();
  state_refs.zero = zero.get();
  state_refs.split = [&](const std::string& name, const at::Tensor& whole, int rank, int size) {
    return models::shard_of(name, whole, c.model, rank, size);
  };
  state_refs.tp_rank = tp_index;
  state_refs.tp_size = tp;
  state_refs.dp_rank = dp_index;
  state_refs.dp_size = dp;
  CheckpointWriter checkpoints(world, c.run.dir, static_cast<int>(c.train.keep_checkpoints), c.train.async_checkpoint,
                               c.comm.timeout_s);

  if (!options.resume && checkpoint::latest_checkpoint(c.run.dir))
    throw UsageError("run.dir '" + c.run.dir + "' already holds checkpoints of an earlier run; continue it with " +
                     "--resume, or choose another run.dir (nothing was changed)");
  // Resume: every rank loads its own shard of the newest checkpoint.
  int64_t start_step = 1;
  if (options.resume) {
    auto latest = checkpoint::latest_checkpoint(c.run.dir);
    if (!latest) throw UsageError("--resume: no checkpoint in '" + c.run.dir + "/checkpoints'");
    // Any layout loads any checkpoint: each rank rebuilds the tensors it needs and takes its part.
    checkpoint::CheckpointReader reader(*latest);
    CheckpointState st = state_from_info(reader);
    check_resume_step(*latest, st.step, c.train.steps);
    load_model_state(reader, state_refs, reader.info().value("optimizer_step", st.step));
    sampler.restore(st.sampler);
    start_step = st.step + 1;
    if (talk)
      std::printf("resumed from %s (step %lld, saved with dp=%d pp=%d tp=%d zero=%d)\n", latest->c_str(),
                  static_cast<long long>(st.step), st.dp, st.pp, st.tp, st.zero);
  }
  reducer.zero_grad();

  std::unique_ptr<obs::MetricsWriter> metrics;
  const std::string config_toml = to_toml(c);
  if (leader) {
    fs::create_directories(c.run.dir);
    std::ofstream(fs::path(c.run.dir) / "config.toml") << config_toml;
    metrics = std::make_unique<obs::MetricsWriter>((fs::path(c.run.dir) / "metrics.jsonl").string(),
                                                   options.resume ? start_step : 0);
  }
  double peak = c.train.peak_flops_per_rank > 0 ? c.train.peak_flops_per_rank : measure_peak_flops();
  {
    // Every rank measured its own; use the mean so MFU is one number.
    at::Tensor t = at::full({1}, peak, at::kDouble);
    world.all_reduce(t, comm::ReduceOp::Avg)->wait();
    peak = t.item<double>();
  }
  const double tokens_per_step = static_cast<double>(c.train.global_batch * c.model.block_size);
  if (talk) {
    std::printf("crosstrain train: %s, %lld parameters, layout dp=%d x pp=%d x tp=%d%s%s, %s\n", c.run.name.c_str(),
                static_cast<long long>(c.model.parameter_count()), dp, pp, tp,
                c.parallel.sequence_parallel ? " (sequence parallel)" : "",
                pp > 1 ? (std::string(", schedule ") + parallel::to_string(layout.schedule) + " x " +
                          std::to_string(M) + " micro-batches").c_str()
                       : "",
                splits.description.c_str());
    const std::string sync = zero ? "ZeRO-" + std::to_string(zero_stage) + " over " + std::to_string(dp) +
                                        " data-parallel ranks, " + std::to_string(zero->unit_count()) + " units"
                                  : std::to_string(bucketed->bucket_count()) + " gradient buckets";
    std::printf("  %lld steps x %lld sequences x %lld tokens; %s; run dir %s\n", static_cast<long long>(c.train.steps),
                static_cast<long long>(c.train.global_batch), static_cast<long long>(c.model.block_size), sync.c_str(),
                c.run.dir.c_str());
    std::printf("  sync: %s\n", sync_strategy->describe().c_str());  // [sync]
    std::fflush(stdout);
  }

  auto evaluate = [&]() -> double {
    torch::NoGradGuard no_grad;
    for (auto& chunk : chunks) chunk->eval();
    // Fixed validation batches, split across replicas like training batches.
    data::DistributedSampler val(c.run.seed ^ 0x5eedULL, static_cast<int64_t>(splits.val.size()), c.model.block_size,
                                 c.train.global_batch, dp_index, dp, static_cast<int>(M));
    double total = 0;
    for (int64_t b = 0; b < c.train.eval_batches; ++b) {
      load_batches(splits.val, [&](int64_t m) { return val.local_offsets(b, static_cast<int>(m)); });
      total += run_pipeline_or_loop(false);
    }
    for (auto& chunk : chunks) chunk->train();
    return total / static_cast<double>(c.train.eval_batches);
  };

  TrainResult result;
  // Ctrl-C stops lockstep training between steps (see stop_vote.h for why only sync.mode = "sync").
  StopVote stop_vote(world, c.sync.mode == "sync" ? options.stop_requested : nullptr);
  auto run_start = Clock::now();
  for (int64_t step = start_step; step <= c.train.steps; ++step) {
    // Errors of any collective name the step: the world and every mesh group know it.
    world.set_step(step);
    for (Axis axis : {Axis::DP, Axis::PP, Axis::TP})
      if (comm::Communicator* group = mesh.group(axis)) group->set_step(step);
    if (stop_vote.agreed()) {
      result.stopped_after = step - 1;
      break;
    }
    stop_vote.post();
    const auto t0 = Clock::now();
    const double lr = learning_rate(step, c.train.warmup_steps, c.train.steps, c.train.lr, c.train.min_lr);
    if (adamw)
      for (auto& group : adamw->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    // Dropout masks depend on (seed, rank, step) only, so a resumed run draws the same ones.
    torch::manual_seed(c.run.seed * 1000003ULL + static_cast<uint64_t>(world.rank()) * 7919ULL + static_cast<uint64_t>(step));

    sync_strategy->before_step(step);  // [sync] ssp: wait for the slowest within the bound
    load_batches(splits.train, [&](int64_t m) { return sampler.local_offsets(step, static_cast<int>(m)); });
    double loss = run_pipeline_or_loop(true);
    if (pipeline) reducer.synchronize();
    loss = sync_strategy->after_backward(step, loss);  // [sync] hierarchical: the cross-cluster gradient average
    if (zero && !partial_grads.empty()) {
      zero->all_reduce_owned_gradients(
          [&](int u, size_t i) { return chunks[0]->is_replicated(unit_params[u][i]); }, *mesh.group(Axis::TP));
    } else {
      for (auto& p : partial_grads) {
        at::Tensor g = p.grad().contiguous();
        mesh.group(Axis::TP)->all_reduce(g, comm::ReduceOp::Sum)->wait();
        p.mutable_grad().copy_(g);
      }
    }
    // Gradient norm of the whole model: each rank adds its shards (replicated ones once per stage).
    double grad_norm = 0;
    if (zero) {
      // Data-parallel ranks own disjoint slices: the sum over the world counts every element once.
      at::Tensor sq = at::full({1}, zero->owned_squared_norm([&](int u, size_t i) {
                                 return tp_index == 0 || !chunks[0]->is_replicated(unit_params[u][i]);
                               }),
                               at::kDouble);
      world.all_reduce(sq, comm::ReduceOp::Sum)->wait();
      grad_norm = std::sqrt(sq.item<double>());
    } else if (pp == 1 && tp == 1) {
      grad_norm = reducer.gradient_norm();
    } else {
      double sq = 0;
      for (auto& chunk : chunks)
        for (const auto& [name, t] : chunk->named_shards())
          if (tp_index == 0 || !chunk->is_replicated(name)) sq += t.grad().pow(2).sum().item<double>();
      grad_norm = std::sqrt(global_mean(sq, true));
    }
    if (c.train.grad_clip > 0 && grad_norm > c.train.grad_clip)
      reducer.scale_gradients(c.train.grad_clip / (grad_norm + 1e-6));
    if (options.keep_parameters && step == c.train.steps && !zero)
      for (const auto& [name, t] : shards) result.gradients[name] = t.grad().clone();
    if (zero)
      zero->step(lr);
    else
      adamw->step();
    reducer.zero_grad();
    sampler.mark_done(step);
    sync_strategy->after_step(step, step == c.train.steps);  // [sync] outer step, gossip round, push/pull

    StepRecord rec;
    rec.step = step;
    rec.loss = loss;
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    rec.step_time_s = seconds_since(t0);
    rec.tokens_per_s = tokens_per_step / rec.step_time_s;
    rec.comm_time_s = reducer.stats().comm_time_s;
    rec.exposed_comm_time_s = reducer.stats().exposed_comm_time_s;
    result.steps.push_back(rec);
    if (!std::isfinite(rec.loss))
      throw Error("step " + std::to_string(step) + ": the loss is " + std::to_string(rec.loss) +
                  "; lower train.lr or check the data");

    double val_loss = -1;
    if (c.train.eval_every > 0 && (step % c.train.eval_every == 0 || step == c.train.steps) && c.data.val_fraction > 0)
      val_loss = result.val_loss = evaluate();

    // Checkpoints: a save on schedule and at the end; an asynchronous one is committed a step later, when its
    // files have had a step's time to be written. checkpoint_s is the time this step spent on them.
    const auto checkpoint_start = Clock::now();
    std::string saved;
    if (checkpoints.pending()) saved = checkpoints.commit();
    const bool last = step == c.train.steps;
    if ((c.train.checkpoint_every > 0 && step % c.train.checkpoint_every == 0) || last) {
      int64_t optimizer_step = 0;
      auto pieces = snapshot_pieces(state_refs, &optimizer_step);
      nlohmann::json info = state_to_info(CheckpointState{step, sampler.state(), config_toml, dp, pp, tp, zero_stage});
      info["optimizer_step"] = optimizer_step;
      checkpoints.save(step, std::move(pieces), std::move(info));
      if (last || !c.train.async_checkpoint) saved = checkpoints.commit();
    }
    if (!saved.empty() && talk && !options.progress_bar) std::printf("saved checkpoint %s\n", saved.c_str());
    const double checkpoint_s = seconds_since(checkpoint_start);

    if (leader) {
      const double mfu = c.model.flops_per_token() * rec.tokens_per_s / (peak * world.size());
      nlohmann::json row = {{"step", step},
                            {"loss", rec.loss},
                            {"lr", lr},
                            {"grad_norm", grad_norm},
                            {"tokens_per_s", rec.tokens_per_s},
                            {"mfu", mfu},
                            {"step_time_s", rec.step_time_s},
                            {"comm_time_s", rec.comm_time_s},
                            {"exposed_comm_time_s", rec.exposed_comm_time_s},
                            {"tokens", static_cast<double>(step) * tokens_per_step},
                            {"peak_rss_bytes", obs::peak_rss_bytes()},
                            {"checkpoint_s", checkpoint_s},
                            {"comm_bytes", reducer.stats().bytes_sent},
                            {"comm_bytes_uncompressed", reducer.stats().bytes_uncompressed},
                            {"time_s", seconds_since(run_start)}};
      if (val_loss >= 0) row["val_loss"] = val_loss;
      {  // [sync] wide-area bytes and compute utilization (compute: step time not spent waiting on communication)
        const SyncStats ss = sync_strategy->stats();
        compute_s += std::max(0.0, rec.step_time_s - rec.exposed_comm_time_s - (ss.blocked_s - sync_blocked_s));
        sync_blocked_s = ss.blocked_s;
        row["sync_mode"] = c.sync.mode;
        row["wan_bytes"] = c.sync.mode == "sync" && !c.sync.hierarchical ? reducer.stats().bytes_sent * step : ss.wan_bytes;
        row["sync_blocked_s"] = ss.blocked_s;
        row["sync_exchanges"] = ss.exchanges;
        row["compute_time_s"] = compute_s;
        row["utilization"] = compute_s / std::max(1e-9, seconds_since(run_start));
        if (c.sync.mode == "async" || c.sync.mode == "ssp") {
          row["staleness_mean"] = ss.staleness_mean;
          row["staleness_max"] = ss.staleness_max;
        }
      }
      const parallel::ModelStateBytes bytes = model_state_bytes();
      row["param_bytes"] = bytes.parameters;
      row["grad_bytes"] = bytes.gradients;
      row["optimizer_bytes"] = bytes.optimizer;
      row["model_state_bytes"] = bytes.total();
      if (zero_stage == 3) row["gathered_peak_bytes"] = bytes.gathered_peak;
      if (pipeline) {
        // The pipeline's timeline of this rank: compute time over step time shows the bubble.
        double busy = 0;
        for (const auto& e : pipeline->timeline())
          if (e.action.type == parallel::ActionType::Forward || e.action.type == parallel::ActionType::Backward ||
              e.action.type == parallel::ActionType::BackwardInput || e.action.type == parallel::ActionType::BackwardWeight)
            busy += e.end_s - e.start_s;
        row["pipeline_compute_s"] = busy;
      }
      metrics->write(row.dump());
      if (!options.quiet && (step % c.run.log_every == 0 || step == c.train.steps || val_loss >= 0)) {
        const int64_t done = step, total = c.train.steps;
        std::string line = "step " + std::to_string(done) + "/" + std::to_string(total) + " | loss " +
                           fmt("%.4f", rec.loss) + (val_loss >= 0 ? " | val " + fmt("%.4f", val_loss) : "") +
                           " | lr " + fmt("%.2e", lr) + " | " + fmt("%.0f", rec.tokens_per_s) + " tok/s | mfu " +
                           fmt("%.1f%%", 100 * mfu) + " | comm " + fmt("%.0f", 1000 * rec.comm_time_s) +
                           " ms (exposed " + fmt("%.0f", 1000 * rec.exposed_comm_time_s) + ")";
        if (options.progress_bar) {
          const int width = 24;
          const int filled = static_cast<int>(width * done / total);
          std::string bar = "[" + std::string(filled, '=') + std::string(width - filled, ' ') + "] ";
          std::printf("\r%s%s\033[K", bar.c_str(), line.c_str());
          if (done == total || val_loss >= 0) std::printf("\n");
        } else {
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
      }
    }
  }
  stop_vote.finish();
  if (result.stopped_after >= 0) {
    // Stopped between steps: an asynchronous save already written is committed; nothing new is started.
    if (checkpoints.pending()) {
      const std::string saved = checkpoints.commit();
      if (talk && !options.progress_bar) std::printf("saved checkpoint %s\n", saved.c_str());
    }
    if (talk && options.progress_bar) std::printf("\n");
    std::fflush(stdout);
    return result;
  }
  if (talk) {
    std::printf("trained %lld steps in %.1f s\n", static_cast<long long>(c.train.steps - start_step + 1),
                seconds_since(run_start));
  }
  if (zero) zero->gather_all_parameters();  // stage 3: the parameters are read below
  if (sampling) {
    {
      torch::NoGradGuard no_grad;
      auto target = full->named_parameters();
      for (const auto& [name, t] : shards) target[name].copy_(t);
    }
    data::ByteTokenizer tok;
    auto prompt = torch::full({1, 1}, static_cast<int64_t>('\n'), torch::kLong);
    auto out = full->generate(prompt, c.train.sample_tokens, 0.8, 40, c.run.seed);
    std::vector<int64_t> ids(out.data_ptr<int64_t>() + 1, out.data_ptr<int64_t>() + out.numel());
    result.sample = tok.decode(ids);
    if (talk) std::printf("--- sample (%lld tokens) ---\n%s\n---\n", static_cast<long long>(c.train.sample_tokens),
                          result.sample.c_str());
  } else if (talk && c.train.sample_tokens > 0) {
    std::printf("(no text sample: generation runs on a single-stage, single-tensor-parallel layout)\n");
  }
  if (options.keep_parameters) {
    for (const auto& [name, t] : shards) {
      result.shards[name] = t.detach().clone();
      auto flat = t.detach().reshape(-1).to(at::kFloat).contiguous();
      result.parameters.insert(result.parameters.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
    }
  }
  return result;
}

}  // namespace crosstrain::train
