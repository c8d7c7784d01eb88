#include "run.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "crosstrain/comm/algorithms/communicator.h"
#include "crosstrain/comm/diagnostics/clock_sync.h"
#include "crosstrain/comm/diagnostics/hang_doctor.h"
#include "crosstrain/comm/diagnostics/recording.h"
#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/core/memory_counter.h"
#include "crosstrain/models/parallelize.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/train/lr_schedule.h"
#include "crosstrain/train/optimizer.h"
#include "crosstrain/train/resume_check.h"
#include "crosstrain/jobs/gpt/sample.h"
#include "crosstrain/train/stop_vote.h"
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/train/debug_fault.h"
#include "crosstrain/train/recording.h"

namespace crosstrain::train {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using parallel::Axis;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void need(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// This rank's parameters in the model's unit order (forward order), the order of the work log's digests.
std::vector<at::Tensor> parameters_in_order(const models::ParallelGPT& model) {
  std::vector<at::Tensor> out;
  for (const auto& names : model.unit_names())
    for (const auto& name : names) out.push_back(model.shards().at(name));
  return out;
}

obs::SpanKind span_kind(parallel::ActionType type) {
  using parallel::ActionType;
  switch (type) {
    case ActionType::Forward:
    case ActionType::Backward:
    case ActionType::BackwardInput:
    case ActionType::BackwardWeight: return obs::SpanKind::Compute;
    default: return obs::SpanKind::P2P;
  }
}

const char* span_name(parallel::ActionType type) {
  using parallel::ActionType;
  switch (type) {
    case ActionType::Forward: return "forward";
    case ActionType::Backward: return "backward";
    case ActionType::BackwardInput: return "backward_input";
    case ActionType::BackwardWeight: return "backward_weight";
    case ActionType::RecvActivation: return "recv_activation";
    case ActionType::SendActivation: return "send_activation";
    case ActionType::RecvGrad: return "recv_grad";
    case ActionType::SendGrad: return "send_grad";
  }
  return "?";
}

double all_reduce(comm::Communicator* group, double value, comm::ReduceOp op) {
  if (!group) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  group->all_reduce(t, op)->wait();
  return t.item<double>();
}

// sync.cluster_batch against the layout; true when it is given (it replaces the even split's divisibility).
bool check_cluster_batch_layout(const Config& c, const parallel::ParallelDims& dims) {
  check_cluster_batch(c);
  const std::vector<int64_t> cluster_batch = parse_cluster_batch(c.sync.cluster_batch);
  // Clusters numbered by the config are known here; from the environment, each rank finds them when it starts.
  if (!cluster_batch.empty() && c.sync.clusters > 0)
    rank_batches(cluster_layout(block_clusters(dims.dp(), static_cast<int>(c.sync.clusters))), cluster_batch,
                 dims.microbatches);
  return !cluster_batch.empty();
}

// model.init_from (docs/huggingface.md): the weights someone trained replace the seeded ones on every rank, each
// copying its own shards, before the optimizer copies them; a resumed run loads its own checkpoint instead.
void start_from_weights(const Config& c, models::ParallelGPT& model, int tp_rank, int tp_size, bool resume, bool talk,
                        bool frozen) {
  if (c.model_init_from.empty()) return;
  // Checkpoints hold what the optimizer trains: frozen weights come from init_from again, then the checkpoint
  // overwrites the rest.
  if (resume && !frozen) {
    if (talk) std::printf("model.init_from '%s' not used: --resume continues from the run's own checkpoint\n",
                          c.model_init_from.c_str());
    return;
  }
  const InitialWeights w = load_initial_weights(c.model_init_from, c.model, model.shards(), tp_rank, tp_size);
  if (!talk) return;
  for (const auto& warning : w.warnings) std::fprintf(stderr, "crosstrain: warning: %s\n", warning.c_str());
  std::printf("%s\n", w.line.c_str());
}

}  // namespace

// ZeRO numbers only the units that have trainable parameters; the model numbers all of its units in forward
// order. With frozen units (fine-tuning) the model's numbers are translated, and frozen units are left alone.
class TrainableUnitHooks : public parallel::UnitHooks {
 public:
  TrainableUnitHooks(parallel::UnitHooks& inner, std::vector<int> zero_index)
      : inner_(inner), zero_index_(std::move(zero_index)) {}
  void before_unit(int unit) override {
    if (zero_index_.at(unit) >= 0) inner_.before_unit(zero_index_[unit]);
  }
  at::Tensor after_unit(int unit, const at::Tensor& output) override {
    return zero_index_.at(unit) >= 0 ? inner_.after_unit(zero_index_[unit], output) : output;
  }

 private:
  parallel::UnitHooks& inner_;
  std::vector<int> zero_index_;
};

parallel::ParallelDims validate(const Config& c, int world) {
  c.model.validate();
  need(c.train.steps >= 1, "train.steps must be at least 1");
  need(c.train.micro_batches >= 1, "train.micro_batches must be at least 1");
  need(c.train.lr > 0 && c.train.min_lr >= 0, "train.lr must be positive and train.min_lr non-negative");
  need(c.train.threads_per_rank >= 1, "train.threads_per_rank must be at least 1");
  need(c.run.log_every >= 1, "run.log_every must be at least 1");
  if (c.comm.compression != "none") comm::make_codec(c.comm.compression);  // throws on a bad spec
  comm::validate(c.comm);
  need(c.train.keep_checkpoints >= 0, "train.keep_checkpoints must be 0 (keep all) or more");
  const parallel::ParallelDims dims = models::gpt_dims(c.model, c.parallel, c.train.micro_batches, world);
  check_sync_config(c.sync, dims.dp(), dims.pp(), dims.tp(), dims.zero);
  // bf16 runs with every layout and sync mode: gradients are reduced in fp32 (inside and across clusters).
  models::parse_recompute(c.train.recompute);  // throws naming the choices
  need(c.train.precision == "fp32" || c.train.precision == "bf16",
       "train.precision = '" + c.train.precision + "': use \"fp32\" or \"bf16\"");
  need(dims.shape.dp_shard == 0 || (sync_traits(c.sync).mode == SyncMode::Sync && !c.sync.hierarchical),
       "parallel.dp_shard (HSDP) runs with sync.mode = \"sync\" (not hierarchical) for now; set parallel.dp_shard = 0 "
       "to shard over every data-parallel rank");
  need(dims.zero == 0 || c.comm.compression == "none",
       "comm.compression applies to plain data parallel; set parallel.zero = 0 or comm.compression = \"none\"");
  const bool uneven = check_cluster_batch_layout(c, dims);
  const int64_t replicas_x_micro = dims.dp() * dims.microbatches;
  need(uneven || c.train.global_batch % replicas_x_micro == 0,
       "train.global_batch = " + std::to_string(c.train.global_batch) + " is not divisible by " +
           std::to_string(dims.dp()) + " data-parallel ranks x " + std::to_string(dims.microbatches) +
           " micro-batches; use a multiple of " + std::to_string(replicas_x_micro));
  need(c.model.vocab_size >= 256 || c.data.format == "bin" || !c.data.tokenizer.empty(),
       "model.vocab_size must be at least 256 for byte-level text");
  return dims;
}



SyncSetup Run::sync_setup(const Config& c, comm::Communicator& world) {
  SyncSetup setup;
  setup.config = c.sync;
  setup.dp = mesh_.group(Axis::DP);
  setup.dp_index = dp_index_;
  setup.dp_size = dims_.dp();
  setup.world_rank = world.rank();
  setup.steps = c.train.steps;
  setup.cluster_hint = cluster_of_this_node(c.sync.topology);
  setup.timeout = world.timeout();
  return setup;
}

Run::Run(const Config& c, const parallel::ParallelDims& dims, comm::Communicator& world, const TrainOptions& options,
         const RunStart& start)
    : c_(c), sync_traits_(sync_traits(c.sync)), recording_(c, world, options.hang_doctor), world_(recording_.world()),
      talk_(world.rank() == 0 && !options.quiet),
      dims_(dims), mesh_(world_, dims_.shape), dp_index_(mesh_.index(Axis::DP)),
      tp_index_(mesh_.index(Axis::TP)),
      checkpoints_(world_, c.run.dir, static_cast<int>(c.train.keep_checkpoints), c.train.async_checkpoint,
                   c.comm.timeout_s, c.debug.checkpoint, c.run.fence, c.run.site),
      dump_(options.dump), stragglers_(c.obs.straggler_margin, static_cast<int>(c.obs.straggler_windows), c.obs.straggler_min_ms / 1000) {
  splits_ = data::load_dataset(c.data, c.model.block_size);
  if (talk_ && !splits_.warning.empty()) std::fprintf(stderr, "crosstrain: warning: %s\n", splits_.warning.c_str());
  data::check_vocab(splits_, c.model.vocab_size, c.data.path);
  // [sync] How replicas agree (docs/wan-training.md): the cluster groups first (they also say each replica's
  // share of the batch); the optimizer's gradient reduction runs over the strategy's group (all replicas, one
  // cluster, or none), then the strategy keeps the optimizer's tensors in agreement.
  const SyncSetup setup = sync_setup(c, world);
  // Only flat sync's wide-area bytes need it (the same on every rank, so all or none take part).
  spans_clusters_ =
      sync_traits_.mode == SyncMode::Sync && !c.sync.hierarchical && spans_clusters(c.sync, setup.cluster_hint);
  sync_ = make_sync_strategy(setup);
  rank_batches_ = rank_batches(sync_->layout(), parse_cluster_batch(c.sync.cluster_batch), dims_.microbatches);
  // Every rank of a data-parallel replica (all its stages and tensor-parallel ranks) reads the same batch.
  // Elastic: the slot in the full job and its global batch, so a replica keeps its share when others leave.
  replica_width_ = std::max(1, start.replica_width);
  const int slot = start.slot >= 0 ? start.first_slot + position_in_replica() : dp_index_;
  const int slots = start.slots > 0 ? start.slots : dims_.dp();
  sampler_ = std::make_unique<data::DistributedSampler>(c.run.seed, static_cast<int64_t>(splits_.train.size()),
                                                        c.model.block_size, c.train.global_batch / dims_.dp() * slots,
                                                        slot, slots, static_cast<int>(dims_.microbatches),
                                                        rank_batches_);
  // bench-memory's baseline: what the process holds before the model, its optimizer and activations exist.
  return_freed_memory();
  rss_before_model_ = obs::rss_bytes();
  install_memory_counter();  // tensors allocated from here on are counted (activation_peak_bytes)
  model_ = models::parallelize(c.model, c.run.seed, dims_, mesh_, sampler_->local_micro_batch(), compute_dtype());
  model_->set_recompute(models::parse_recompute(c.train.recompute));
  const models::ParallelPlan plan(c.model);
  const std::set<std::string> frozen = models::frozen_parameters(plan, c.model, c.train.freeze);
  flops_per_token_ = models::training_flops_per_token(plan, c.model, frozen);
  start_from_weights(c, *model_, tp_index_, dims_.tp(), start.resume, talk_, !frozen.empty());
  freeze(frozen);

  OptimizerConfig oc;
  oc.adam = {c.train.lr, c.train.beta1, c.train.beta2, c.train.eps, c.train.weight_decay};
  oc.zero = dims_.zero;
  oc.dtype = compute_dtype();
  oc.bucket_bytes = static_cast<int64_t>(c.parallel.bucket_mb * (1 << 20));
  oc.compression = c.comm.compression;
  std::vector<std::vector<NamedParameter>> units;
  for (const auto& names : model_->unit_names()) {
    units.emplace_back();  // kept when all of it is frozen: ZeRO-3's hooks number the units in forward order
    for (const auto& name : names)
      if (!frozen.count(name)) units.back().push_back({name, model_->shards().at(name)});
  }
  // HSDP: ZeRO shards over a group of the data-parallel ranks and averages each slice over the copies.
  const bool hsdp = dims_.zero > 0 && dims_.shape.state_copies() > 1;
  optimizer_ = hsdp ? make_optimizer(units, mesh_.shard_group(), oc, mesh_.replicate_group())
                    : make_optimizer(units, sync_->gradient_group(), oc);
  if (parallel::UnitHooks* hooks = optimizer_->unit_hooks()) {
    std::vector<int> zero_index;
    int next = 0;
    for (const auto& unit : units) zero_index.push_back(unit.empty() ? -1 : next++);
    unit_hooks_ = std::make_unique<TrainableUnitHooks>(*hooks, std::move(zero_index));
    model_->chunks()[0]->set_unit_hooks(unit_hooks_.get());
  }
  ModelOptimizer* opt = optimizer_.get();
  sync_->attach(optimizer_->sync_tensors(), optimizer_->sync_tensors_sharded(), [opt] { opt->sync_tensors_changed(); });

  if (start.refuse_old_run_dir && !start.resume && checkpoint::latest_checkpoint(c.run.dir))
    throw UsageError("run.dir '" + c.run.dir + "' already holds checkpoints of an earlier run; continue it with " +
                     "--resume, or choose another run.dir (nothing was changed)");
  if (start.resume) resume();
  sync_->start(start_step_);
  optimizer_->zero_grad();
  // MFU's denominator (docs/observability.md): the best sustained GEMM rate at the model's own shapes, with this
  // rank's threads, the ranks of a host timing in turn.
  if (c.train.peak_flops_per_rank > 0) {
    peak_flops_ = c.train.peak_flops_per_rank;
  } else if (start.peak.best_flops > 0) {
    gemm_peak_ = start.peak;
    peak_flops_ = gemm_peak_.best_flops;
  } else {
    // The ranks that measured first wait for the host's last one in the average below: the lock is given up on
    // after a quarter of the collective timeout, so that wait stays well inside it.
    gemm_peak_ = measure_model_peak(c, sampler_->local_micro_batch());
    peak_flops_ = gemm_peak_.best_flops;
  }
  // Every rank measured its own; the mean makes MFU one number. A configured peak is the same everywhere: no
  // collective (an elastic generation's set-up pays each one across the wide-area link).
  if (c.train.peak_flops_per_rank <= 0) peak_flops_ = all_reduce(&world_, peak_flops_, comm::ReduceOp::Avg);
  if (c.run.work_log) open_work_log(c);
  start_trace(start);
}

void Run::open_work_log(const Config& c) {
  // A replica's tokens count once: on its first stage's tensor-parallel rank 0.
  const bool counts = tp_index_ == 0 && mesh_.index(Axis::PP) == 0;
  work_log_ = WorkLog::open(world_, c.run.dir, cluster_of_this_node(c.sync.topology),
                            counts ? sampler_->local_batch() * c.model.block_size : 0);
  // The cluster's claims (`crosstrain ledger claim`) read the model's FLOPs per token from the run's config: at a
  // site of its own (run.site) rank 0's copy is elsewhere, so the writer of the work log leaves one beside it.
  const std::filesystem::path config = std::filesystem::path(c.run.dir) / "config.toml";
  if (work_log_->writes() && !c.run.site.empty() && !std::filesystem::exists(config))
    std::ofstream(config) << to_toml(c);
  wan_bytes_logged_ = sync_->stats().wan_bytes;
}

Run::~Run() {
  if (recording_.tracer()) flush_trace();
}

// Whether the job's ranks sit in more than one cluster: sync.clusters, else every rank's own cluster (from
// sync.topology or the node's variable; a rank without one puts the job in one cluster, as the strategy does).
bool Run::spans_clusters(const SyncConfig& s, int cluster_hint) {
  if (s.clusters > 0) return s.clusters > 1;
  at::Tensor mine = at::full({1}, static_cast<int64_t>(cluster_hint), at::kLong);
  at::Tensor all = at::empty({world_.size()}, at::kLong);
  world_.all_gather(mine, all)->wait();
  std::set<int64_t> clusters;
  for (int r = 0; r < world_.size(); ++r) {
    const int64_t id = all[r].item<int64_t>();
    if (id < 0) return false;
    clusters.insert(id);
  }
  return clusters.size() > 1;
}

void Run::start_trace(const RunStart& start) {
  obs::TraceIdentity id;
  id.dp = dims_.dp();
  id.pp = dims_.pp();
  id.tp = dims_.tp();
  id.dp_index = dp_index_;
  id.pp_index = mesh_.index(Axis::PP);
  id.tp_index = tp_index_;
  // A fresh run starts its trace over; a resumed run and elastic generations add to it.
  recording_.start_trace(id, start.resume || !start.refuse_old_run_dir);
}

void Run::flush_trace() { recording_.flush_trace(optimizer_->memory().total()); }

// The pipeline runtime keeps its own timeline of the step (seconds since it started): each action a span.
void Run::trace_pipeline_step(int64_t step, int64_t started_us) {
  auto* pipeline = model_->pipeline();
  if (!recording_.tracer() || !pipeline) return;
  const int stages = pipeline->spec().stages, stage = mesh_.index(Axis::PP);
  for (const auto& e : pipeline->timeline()) {
    obs::Span span;
    span.kind = span_kind(e.action.type);
    span.name = span_name(e.action.type);
    span.ts_us = started_us + static_cast<int64_t>(e.start_s * 1e6);
    span.dur_us = static_cast<int64_t>((e.end_s - e.start_s) * 1e6);
    span.step = step;
    span.mb = e.action.microbatch;
    span.stage = e.action.chunk * stages + stage;
    if (span.kind == obs::SpanKind::P2P) {
      const bool towards_next = e.action.type == parallel::ActionType::SendActivation ||
                                e.action.type == parallel::ActionType::RecvGrad;
      span.peer = (stage + (towards_next ? 1 : stages - 1)) % stages;
    }
    recording_.tracer()->add(span);
  }
}

StatePlacement Run::placement() const {
  StatePlacement w;
  w.global_shapes = model_->global_shapes();
  // One plan for every tensor of the load (the reader calls this once per stored tensor-parallel shard).
  auto plan = std::make_shared<const models::ParallelPlan>(c_.model);
  w.split = [plan](const std::string& name, const at::Tensor& whole, int rank, int size) {
    return models::shard_of(*plan, name, whole, rank, size);
  };
  w.tp_rank = tp_index_;
  w.tp_size = dims_.tp();
  const SyncStrategy::CheckpointCopy copy = sync_->checkpoint_copy();
  w.copy = copy.copy;
  w.writer = copy.writer;
  w.writers = copy.writers;
  return w;
}

// Every rank loads its own part of the newest checkpoint, whatever layout wrote it.
void Run::freeze(const std::set<std::string>& frozen) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : model_->shards()) {
    if (!frozen.count(name)) continue;
    at::Tensor& p = const_cast<at::Tensor&>(t);
    p.requires_grad_(false);
    if (compute_dtype() != at::kFloat) p.set_data(p.data().to(compute_dtype()));
  }
  for (const auto& p : model_->partial_gradient_parameters())
    if (p.requires_grad()) partial_trainable_.push_back(p);
  // Every rank judges every stage from the plan, so all of them stop here (none waits for a stage that left).
  const models::ParallelPlan plan(c_.model);
  const int stages = dims_.virtual_stages();
  for (int v = 0; v < stages; ++v) {
    const models::StageSpec spec{dims_.bounds[v], dims_.bounds[v + 1], v == 0, v == stages - 1};
    bool trains = false;
    for (const auto& name : plan.stage_parameters(spec)) trains = trains || !frozen.count(name);
    if (!trains)
      throw UsageError("train.freeze = \"" + c_.train.freeze + "\" freezes every parameter of pipeline stage " +
                       std::to_string(v) + "; freeze fewer blocks or use fewer stages (parallel.pp)");
  }
  if (talk_ && !frozen.empty()) {
    int64_t fixed = 0, total = 0;
    for (const auto& [name, t] : model_->shards()) (frozen.count(name) ? fixed : total) += t.numel();
    std::printf("fine-tuning: %lld of this rank's parameters trained, %lld frozen (train.freeze = \"%s\"%s)\n",
                static_cast<long long>(total), static_cast<long long>(fixed), c_.train.freeze.c_str(),
                c_.model.lora_rank > 0 ? ", LoRA adapters" : "");
  }
}

void Run::resume() {
  auto latest = checkpoint::latest_checkpoint(c_.run.dir);
  if (!latest) throw UsageError("--resume: no checkpoint in '" + c_.run.dir + "/checkpoints'");
  check_resume_model(c_, *latest);  // the same model: its config and tensors (train/resume_check.h)
  checkpoint::CheckpointReader reader(*latest);
  CheckpointState st = state_from_info(reader);
  check_resume_step(*latest, st.step, c_.train.steps);
  optimizer_->load(reader, placement(), sync_->state());
  sampler_->restore(st.sampler);
  start_step_ = st.step + 1;
  if (talk_)
    std::printf("resumed from %s (step %lld, saved with dp=%d pp=%d tp=%d zero=%d)\n", latest->c_str(),
                static_cast<long long>(st.step), st.dp, st.pp, st.tp, st.zero);
}

void Run::print_header() const {
  if (!talk_) return;
  std::printf("crosstrain train: %s, %lld parameters, layout %s, %s\n", c_.run.name.c_str(),
              static_cast<long long>(c_.model.parameter_count()), dims_.describe().c_str(),
              splits_.description.c_str());
  std::printf("  %lld steps x %lld sequences x %lld tokens; %s; run dir %s\n", static_cast<long long>(c_.train.steps),
              static_cast<long long>(c_.train.global_batch), static_cast<long long>(c_.model.block_size),
              optimizer_->describe().c_str(), c_.run.dir.c_str());
  std::printf("  sync: %s\n", sync_->describe().c_str());  // [sync]
  if (work_log_)
    std::printf("  work log: %s/work/cluster<K>.jsonl, a line per step from each cluster's first rank (docs/ledger.md)\n",
                c_.run.dir.c_str());
  if (gemm_peak_.best_flops > 0)
    std::printf("  MFU peak per thread (%s): %s\n", c_.train.precision.c_str(), describe(gemm_peak_).c_str());
  std::fflush(stdout);
}

void Run::load_batches(const data::TokenStream& stream, const data::LossMask& mask,
                       const std::function<std::vector<int64_t>(int64_t)>& offsets_of,
                       const std::function<std::vector<int64_t>()>& global_offsets) {
  const int64_t T = c_.model.block_size;
  std::vector<int64_t> counts;
  int64_t micro_sequences = 0;
  for (int64_t m = 0; m < dims_.microbatches; ++m) {
    const std::vector<int64_t> offsets = offsets_of(m);
    data::make_batch(stream, offsets, T, model_->inputs[m], model_->targets[m]);
    if (mask.empty()) continue;
    counts.push_back(mask.apply(offsets, T, model_->targets[m].data_ptr<int64_t>()));
    micro_sequences = static_cast<int64_t>(offsets.size());
  }
  if (mask.empty()) return;
  // Every rank counts the whole global batch itself (same offsets everywhere): no collective needed.
  const std::vector<int64_t> global = global_offsets();
  model_->loss_weights = data::micro_batch_loss_weights(counts, micro_sequences, mask.count(global, T),
                                                        static_cast<int64_t>(global.size()));
}

// The replica's loss of the loaded micro-batches (training: with gradients reduced). Losses are summed inside
// each replica and averaged over the replicas that reduce gradients together, so replicas that run apart
// (asynchronous modes) never wait for each other here.
double Run::forward_backward(bool training) {
  parallel::GradReducer& reducer = optimizer_->reducer();
  if (auto* pipeline = model_->pipeline()) {
    const int64_t started_us = comm::monotonic_us();
    double local = 0;
    {
      Phase phase(nullptr, recording_.recorder(), obs::SpanKind::Compute, training ? "pipeline step" : "pipeline eval", step_);
      local = training ? pipeline->train_step() : pipeline->eval_step();
    }
    if (training) trace_pipeline_step(step_, started_us);
    const bool contributes = pipeline->holds_last_stage() && tp_index_ == 0;
    const double replica = all_reduce(mesh_.replica_group(), contributes ? local : 0.0, comm::ReduceOp::Sum);
    if (training && digests_gradients()) step_digest_ = gradient_digest(parameters_in_order(*model_));
    if (training) reducer.synchronize();
    return training ? all_reduce(sync_->gradient_group(), replica, comm::ReduceOp::Avg) : replica;
  }
  const int64_t M = dims_.microbatches;
  // run.work_log: the reduction waits for the end of backward, when this rank's own gradient is digested.
  const bool deferred = work_log_ != nullptr;
  double loss = 0;
  for (int64_t m = 0; m < M; ++m) {
    const bool last = m == M - 1;
    reducer.set_sync(last && !deferred);
    at::Tensor l;
    {
      Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Compute, "forward", step_, static_cast<int>(m));
      l = model_->loss(m) / static_cast<double>(M);
      loss += l.item<double>();
    }
    if (!training) continue;
    // The loss rides with the gradients: averaged over the data-parallel ranks in the same collective.
    if (last) reducer.set_side_value(0, loss);
    Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Compute, "backward", step_, static_cast<int>(m));
    l.backward();
  }
  if (!training) return loss;
  if (deferred) {
    if (digests_gradients()) step_digest_ = gradient_digest(parameters_in_order(*model_));
    reducer.set_sync(true);  // a syncing pass: ZeRO-1 averages the side values (the loss) only then
    reducer.synchronize();
  } else {
    reducer.finish();
  }
  if (!sync_->gradient_group()) return loss;
  // Replicated bf16 buckets would round the loss riding in them; it travels on its own then.
  const bool exact_side_values = dims_.zero > 0 || compute_dtype() == at::kFloat;
  return exact_side_values ? reducer.side_value(0) : all_reduce(sync_->gradient_group(), loss, comm::ReduceOp::Avg);
}

void Run::set_step(int64_t step) {
  // Errors of any collective name the step: the world and every mesh group know it.
  world_.set_step(step);
  for (Axis axis : {Axis::DP, Axis::PP, Axis::TP})
    if (comm::Communicator* group = mesh_.group(axis)) group->set_step(step);
}

StepRecord Run::train_step(int64_t step, const std::function<void()>& before_commit) {
  const auto t0 = Clock::now();
  const double blocked_before = recording_.recorder().blocked_seconds(), sync_before = sync_->stats().blocked_s;
  step_ = step;
  exchanges_before_step_ = sync_->stats().exchanges;
  recording_.recorder().set_step(step);
  StepRecord rec;
  {
    Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Step, "step", step);
    rec = step_phases(step, before_commit);
  }
  voted_.reset();
  rec.step_time_s = seconds_since(t0);
  rec.tokens_per_s = static_cast<double>(c_.train.global_batch * c_.model.block_size) / rec.step_time_s;
  rec.local_batch = sampler_->local_batch();
  rec.comm_time_s = optimizer_->reducer().stats().comm_time_s;
  rec.exposed_comm_time_s = optimizer_->reducer().stats().exposed_comm_time_s;
  if (dims_.tp() > 1 || dims_.pp() > 1) {
    // Tensor- and pipeline-parallel transfers block the training thread where they happen (inside forward and
    // backward): the time blocked on communication in this step, less the reducer's and the sync mode's waits.
    const double blocked = recording_.recorder().blocked_seconds() - blocked_before;
    const double model_parallel = std::max(0.0, blocked - rec.exposed_comm_time_s - (sync_->stats().blocked_s - sync_before));
    rec.comm_time_s += model_parallel;
    rec.exposed_comm_time_s += model_parallel;
  }
  if (!std::isfinite(rec.loss))
    throw Error("step " + std::to_string(step) + ": the loss is " + std::to_string(rec.loss) +
                "; lower train.lr or check the data");
  if (work_log_) log_work(step);
  if (window_busy_s_.empty()) window_first_step_ = step;
  window_busy_s_.push_back(std::max(0.0, rec.step_time_s - (recording_.recorder().blocked_seconds() - blocked_before)));
  if (sync_traits_.lockstep && c_.obs.straggler_every > 0 && step % c_.obs.straggler_every == 0) exchange_straggler_timings(step);
  if (step % c_.obs.trace_flush_every == 0) flush_trace();
  return rec;
}

StepRecord Run::step_phases(int64_t step, const std::function<void()>& before_commit) {
  using obs::SpanKind;
  obs::Tracer* t = recording_.tracer();
  StepRecord rec;
  rec.step = step;
  rec.lr = learning_rate(step, c_.train.warmup_steps, c_.train.steps, c_.train.lr, c_.train.min_lr);
  // Dropout masks depend on (seed, rank, step) only, so a resumed run draws the same ones.
  torch::manual_seed(c_.run.seed * 1000003ULL + static_cast<uint64_t>(world_.rank()) * 7919ULL +
                     static_cast<uint64_t>(step));
  {
    Phase phase(t, recording_.recorder(), SpanKind::Sync, "sync.before_step", step);
    sync_->before_step(step);  // [sync] ssp: wait for the slowest within the bound
  }
  {
    Phase phase(t, recording_.recorder(), SpanKind::Data, "data", step);
    load_batches(
        splits_.train, splits_.train_mask,
        [&](int64_t m) { return sampler_->local_offsets(step, static_cast<int>(m)); },
        [&] { return sampler_->global_offsets(step); });
  }
  MemoryWatermark activations;  // tensors allocated by forward and backward above those the step began with
  const double replica_loss = forward_backward(true);
  activation_peak_bytes_ = activations.peak_above_baseline();
  {
    Phase phase(t, recording_.recorder(), SpanKind::Sync, "sync.after_backward", step);
    rec.loss = sync_->after_backward(step, replica_loss);  // [sync] hierarchical: across clusters
  }
  {
    Phase phase(t, recording_.recorder(), SpanKind::Optimizer, "grad_norm", step);
    if (!partial_trainable_.empty()) optimizer_->sum_partial_gradients(partial_trainable_, *mesh_.group(Axis::TP));
    // Replicated parameters count once: on tensor-parallel rank 0.
    rec.grad_norm = optimizer_->gradient_norm(
        [&](const std::string& name) { return tp_index_ == 0 || !model_->is_replicated(name); }, mesh_.replica_group());
    if (c_.train.grad_clip > 0 && rec.grad_norm > c_.train.grad_clip)
      optimizer_->reducer().scale_gradients(c_.train.grad_clip / (rec.grad_norm + 1e-6));
  }
  if (dump_ && step == c_.train.steps) dump_->gradients = optimizer_->gradients();
  if (before_commit) {
    Phase phase(t, recording_.recorder(), SpanKind::Elastic, "vote", step);
    before_commit();
    voted_ = rec;  // until the step returns: what its row reads if its own exchange below fails
  }
  {
    Phase phase(t, recording_.recorder(), SpanKind::Optimizer, "optimizer", step);
    optimizer_->step(rec.lr);
    optimizer_->zero_grad();
  }
  sampler_->mark_done(step);
  Phase phase(t, recording_.recorder(), SpanKind::Sync, "sync.after_step", step);
  sync_->after_step(step, step == c_.train.steps);  // [sync] outer step, gossip round, push/pull
  return rec;
}

// run.work_log: the step's line. Bytes: this rank's share of the gradient reduction in the step, and what the
// strategy sent across clusters since the last line.
void Run::log_work(int64_t step) {
  const int64_t wan = sync_->stats().wan_bytes;
  const int64_t bytes = optimizer_->reducer().stats().bytes_sent + (wan - wan_bytes_logged_);
  wan_bytes_logged_ = wan;
  work_log_->record(step, step_digest_, bytes);
  step_digest_.clear();
}

// Every straggler_every steps (lockstep training): each rank's busy time per step, a few bytes from each.
void Run::exchange_straggler_timings(int64_t step) {
  // Each rank's busy time and its pipeline stage: stages do different work, so ranks are compared within theirs.
  at::Tensor mine = at::tensor({obs::median_step(window_busy_s_), static_cast<double>(mesh_.index(Axis::PP))}, at::kDouble);
  at::Tensor all = at::zeros({2 * world_.size()}, at::kDouble);
  world_.all_gather(mine, all)->wait();
  std::vector<double> busy;
  std::vector<int> stage;
  for (int r = 0; r < world_.size(); ++r) {
    busy.push_back(all[2 * r].item<double>());
    stage.push_back(static_cast<int>(all[2 * r + 1].item<double>()));
  }
  last_verdict_ = stragglers_.update(busy, stage);
  verdict_fresh_ = true;
  if (world_.rank() == 0 && (last_verdict_.named_now || last_verdict_.cleared_now))
    std::fprintf(stderr, "crosstrain: warning: %s\n",
                 obs::straggler_warning(last_verdict_, window_first_step_, step).c_str());
  window_busy_s_.clear();
}

// Fixed validation batches, split across replicas like training batches; the mean over every sequence (each
// replica's loss weighted by its share of the batch, 1 for an even split).
Evaluation Run::evaluate() {
  Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Eval, "evaluate", step_);
  torch::NoGradGuard no_grad;
  model_->train(false);
  data::DistributedSampler val(c_.run.seed ^ 0x5eedULL, static_cast<int64_t>(splits_.val.size()), c_.model.block_size,
                               c_.train.global_batch, dp_index_, dims_.dp(), static_cast<int>(dims_.microbatches),
                               rank_batches_);
  const double share = static_cast<double>(val.local_batch() * dims_.dp()) / static_cast<double>(c_.train.global_batch);
  double total = 0;
  for (int64_t b = 0; b < c_.train.eval_batches; ++b) {
    load_batches(
        splits_.val, splits_.val_mask, [&](int64_t m) { return val.local_offsets(b, static_cast<int>(m)); },
        [&] { return val.global_offsets(b); });
    const double replica = forward_backward(false);
    // Every rank of a replica holds its loss: count it once per replica.
    const bool counted = tp_index_ == 0 && mesh_.index(Axis::PP) == 0;
    total += all_reduce(&world_, counted ? replica * share : 0.0, comm::ReduceOp::Sum) / dims_.dp();
  }
  model_->train(true);
  Evaluation e;
  e.loss = total / static_cast<double>(c_.train.eval_batches);
  return e;
}

// A save on schedule and at the end; an asynchronous one is committed a step later, when its files have had a
// step's time to be written.
std::string Run::checkpoint(int64_t step) {
  Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Checkpoint, "checkpoint", step);
  std::string saved = commit_pending();
  const bool last = step == c_.train.steps;
  if ((c_.train.checkpoint_every > 0 && step % c_.train.checkpoint_every == 0) || last) {
    const std::string now = save(step, last || !c_.train.async_checkpoint);
    if (!now.empty()) saved = now;
  }
  return saved;
}

std::string Run::save_now(int64_t step) {
  Phase phase(recording_.tracer(), recording_.recorder(), obs::SpanKind::Checkpoint, "checkpoint", step);
  commit_pending();
  sync_->settle(step);
  return save(step, /*commit=*/true);
}

std::string Run::save(int64_t step, bool commit) {
  auto pieces = optimizer_->checkpoint_pieces(placement(), sync_->state());
  nlohmann::json info = state_to_info(CheckpointState{step, sampler_->state(), to_toml(c_), dims_.dp(), dims_.pp(),
                                                      dims_.tp(), dims_.zero});
  info["optimizer_step"] = optimizer_->step_count();
  info["sync_mode"] = to_string(c_.sync.mode);
  checkpoints_.save(step, std::move(pieces), std::move(info));
  return commit ? checkpoints_.commit() : "";
}

void Run::add_metrics(obs::StepMetrics& m, const StepRecord& rec, double elapsed_s) {
  const double achieved = flops_per_token_ * rec.tokens_per_s / world_.size();
  m.mfu = achieved / peak_flops_;
  m.extra["gemm_peak_flops"] = peak_flops_;
  m.extra["achieved_flops_per_rank"] = achieved;
  const parallel::ReducerStats rs = optimizer_->reducer().stats();
  m.extra["tokens"] = static_cast<double>(rec.step) * c_.train.global_batch * c_.model.block_size;
  m.counts["rss_before_model_bytes"] = rss_before_model_;
  m.counts["comm_bytes"] = rs.bytes_sent;
  m.counts["comm_bytes_uncompressed"] = rs.bytes_uncompressed;
  // [sync] wide-area bytes and compute utilization (compute: step time not spent waiting on communication).
  const SyncStats ss = sync_->stats();
  compute_s_ += std::max(0.0, rec.step_time_s - rec.exposed_comm_time_s - (ss.blocked_s - sync_blocked_s_));
  sync_blocked_s_ = ss.blocked_s;
  m.labels["sync_mode"] = to_string(c_.sync.mode);
  const bool flat = sync_traits_.mode == SyncMode::Sync && !c_.sync.hierarchical;
  m.counts["wan_bytes"] = !flat ? ss.wan_bytes : spans_clusters_ ? rs.bytes_sent * rec.step : 0;
  m.extra["sync_blocked_s"] = ss.blocked_s;
  m.counts["sync_exchanges"] = ss.exchanges;
  m.extra["compute_time_s"] = compute_s_;
  m.extra["utilization"] = compute_s_ / std::max(1e-9, elapsed_s);
  if (sync_traits_.parameter_server) {
    m.extra["staleness_mean"] = ss.staleness_mean;
    m.counts["staleness_max"] = ss.staleness_max;
  }
  const parallel::ModelStateBytes bytes = optimizer_->memory();
  m.counts["param_bytes"] = bytes.parameters;
  m.counts["grad_bytes"] = bytes.gradients;
  m.counts["optimizer_bytes"] = bytes.optimizer;
  m.counts["model_state_bytes"] = bytes.total();
  // Saved activations (and backward's temporaries) at their peak, counted at the allocator: what
  // train.recompute trades for compute.
  m.counts["activation_peak_bytes"] = activation_peak_bytes_;
  if (verdict_fresh_) {
    // Only on the steps that exchanged timings: each rank's busy time and its score against the others.
    m.series["rank_busy_s"] = last_verdict_.busy_s;
    m.series["straggler_score"] = last_verdict_.scores;
    m.counts["straggler_rank"] = last_verdict_.straggler;
    verdict_fresh_ = false;
  }
  if (recording_.tracer()) m.counts["trace_dropped_events"] = recording_.tracer()->dropped();
  if (dims_.zero == 3) m.counts["gathered_peak_bytes"] = bytes.gathered_peak;
  if (auto* pipeline = model_->pipeline()) {
    // The pipeline's timeline of this rank: compute time over step time shows the bubble.
    double busy = 0;
    for (const auto& e : pipeline->timeline())
      if (e.action.type == parallel::ActionType::Forward || e.action.type == parallel::ActionType::Backward ||
          e.action.type == parallel::ActionType::BackwardInput || e.action.type == parallel::ActionType::BackwardWeight)
        busy += e.end_s - e.start_s;
    m.extra["pipeline_compute_s"] = busy;
  }
}

// Text comes from the checkpoint saved at the end, which holds the whole model in any layout.
std::string Run::sample() { return sample_text(c_, *checkpoint::latest_checkpoint(c_.run.dir)); }

void Run::fill_dump() {
  if (!dump_) return;
  optimizer_->gather_parameters();  // ZeRO-3: whole parameters before they are read
  dump_->shards.clear();
  dump_->flat.clear();
  for (const auto& [name, t] : model_->shards()) {
    dump_->shards[name] = t.detach().clone();
    auto flat = t.detach().reshape(-1).to(at::kFloat).contiguous();
    dump_->flat.insert(dump_->flat.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
  }
}

// ---- elastic training ----------------------------------------------------------------------------------

std::vector<at::Tensor> Run::state_tensors() {
  std::vector<at::Tensor> all = optimizer_->live_state();
  for (const ExtraState& extra : sync_->state())
    for (const at::Tensor& t : extra.tensors) all.push_back(t);
  for (const at::Tensor& t : sync_->live_tensors()) all.push_back(t);
  return all;
}

LiveState Run::live_state(int64_t next_step) {
  LiveState s;
  s.tensors = state_tensors();
  s.optimizer_steps = optimizer_->step_count();
  s.next_step = next_step;
  return s;
}

void Run::adopt(const LiveState& from) {
  torch::NoGradGuard no_grad;
  std::vector<at::Tensor> mine = state_tensors();
  if (mine.size() != from.tensors.size())
    throw Error("elastic: the state to adopt has " + std::to_string(from.tensors.size()) + " tensors, this rank " +
                std::to_string(mine.size()) + " (the layout changed between generations: a bug)");
  for (size_t i = 0; i < mine.size(); ++i) mine[i].copy_(from.tensors[i]);
  optimizer_->set_step_count(from.optimizer_steps);
  optimizer_->sync_tensors_changed();
}

bool Run::at_sync_boundary() const {
  // Streaming DiLoCo syncs a fragment at a time: no step has every parameter agreed, so any step will do.
  if (sync_traits_.mode != SyncMode::DiLoCo || c_.sync.fragments > 1) return true;
  return sync_->stats().exchanges > exchanges_before_step_;
}

std::vector<std::vector<int>> Run::replica_groups() const {
  if (sync_traits_.mode == SyncMode::DiLoCo) return sync_->layout().local;  // a replica is a cluster
  std::vector<std::vector<int>> groups(static_cast<size_t>(dims_.dp() / replica_width_));
  for (int r = 0; r < dims_.dp(); ++r) groups[static_cast<size_t>(r / replica_width_)].push_back(r);
  return groups;
}

int Run::position_in_replica() const {
  for (const auto& g : replica_groups()) {
    const auto it = std::find(g.begin(), g.end(), dp_index_);
    if (it != g.end()) return static_cast<int>(it - g.begin());
  }
  return dp_index_ % replica_width_;
}

HealStats Run::heal_from(int donor, const std::vector<int>& receivers, int64_t& next_step,
                         const std::function<void()>& midway) {
  HealStats stats;
  // A copy of the state is one data-parallel rank, or (HSDP) a group of them that shards it: each shard goes to
  // the rank that holds the same shard in the receiving copies. Replicas of different sizes (whole copies on
  // every rank) pair each receiving rank with the donor's rank at its position modulo the donor's size.
  const int me = dp_index_;
  comm::Communicator* dp = mesh_.group(Axis::DP);
  const std::vector<std::vector<int>> groups = replica_groups();
  auto replica_of = [&](int r) {
    for (size_t g = 0; g < groups.size(); ++g)
      if (std::find(groups[g].begin(), groups[g].end(), r) != groups[g].end()) return static_cast<int>(g);
    throw Error("elastic: data-parallel rank " + std::to_string(r) + " is in no replica of this generation (a bug)");
  };
  const int donor_replica = replica_of(donor), mine = replica_of(me);
  const std::vector<int>& from = groups[static_cast<size_t>(donor_replica)];
  std::set<int> receiving_replicas;
  for (int r : receivers) receiving_replicas.insert(replica_of(r));
  // A replica is behind or ahead as a whole (its ranks commit every step together, after the vote): a receiver in
  // the donor's own replica would mean its ranks disagree.
  if (receiving_replicas.count(donor_replica))
    throw Error("elastic: data-parallel rank " + std::to_string(donor) + " would heal itself: the ranks of replica " +
                std::to_string(donor_replica) + " hold different steps (a bug; please report it)");
  const bool receiving = receiving_replicas.count(mine) > 0, giving = mine == donor_replica;
  std::set<int> peers;  // the giving rank's receivers
  for (int g : receiving_replicas)
    for (size_t i = 0; i < groups[static_cast<size_t>(g)].size(); ++i)
      if (from[i % from.size()] == me) peers.insert(groups[static_cast<size_t>(g)][i]);
  donor = from[static_cast<size_t>(position_in_replica()) % from.size()];  // this rank's own donor when receiving
  if (!dp || (!giving && !receiving)) return stats;
  torch::NoGradGuard no_grad;
  // One flat buffer per dtype: a transfer per tensor would pay the per-message latency hundreds of times.
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
  for (at::Tensor& t : state_tensors()) by_dtype[t.scalar_type()].push_back(t);
  at::Tensor scalars = at::tensor({next_step, optimizer_->step_count()}, at::kLong);
  auto transfer = [&](at::Tensor& t) {
    if (giving) {
      std::vector<comm::WorkPtr> sends;
      for (int peer : peers) sends.push_back(dp->send(t, peer, 0));
      comm::wait_all(sends);
    } else {
      dp->recv(t, donor, 0)->wait();
    }
  };
  // Buffers first (the donor packs its state, a receiver allocates), so that the timing is the transfer alone.
  std::vector<at::Tensor> buffers;
  for (auto& [dtype, tensors] : by_dtype) {
    int64_t numel = 0;
    std::vector<at::Tensor> flat;
    for (const auto& t : tensors) {
      numel += t.numel();
      if (giving) flat.push_back(t.reshape(-1));
    }
    // A receiver touches its pages now: page faults inside the transfer would halve the measured rate.
    buffers.push_back(giving ? at::cat(flat) : at::zeros({numel}, at::TensorOptions().dtype(dtype)));
  }
  transfer(scalars);  // also lines the two sides up
  if (!giving && midway) midway();
  const auto t0 = std::chrono::steady_clock::now();
  for (at::Tensor& buffer : buffers) {
    transfer(buffer);
    stats.bytes += buffer.numel() * static_cast<int64_t>(buffer.element_size());
  }
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (giving) return stats;
  size_t b = 0;
  for (auto& [dtype, tensors] : by_dtype) {
    int64_t offset = 0;
    for (auto& t : tensors) {
      t.copy_(buffers[b].narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
    ++b;
  }
  next_step = scalars[0].item<int64_t>();
  optimizer_->set_step_count(scalars[1].item<int64_t>());
  optimizer_->sync_tensors_changed();
  start_step_ = next_step;
  return stats;
}

namespace {

// FNV-1a over the bytes of `tensors`, then `steps`.
std::string fnv1a_digest(const std::vector<at::Tensor>& tensors, int64_t steps) {
  uint64_t h = 1469598103934665603ULL;
  auto mix = [&](const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ULL;
  };
  for (const at::Tensor& t : tensors) {
    at::Tensor c = t.contiguous();
    mix(c.data_ptr(), c.numel() * c.element_size());
  }
  mix(&steps, sizeof steps);
  char out[17];
  std::snprintf(out, sizeof out, "%016llx", static_cast<unsigned long long>(h));
  return out;
}

}  // namespace

std::string Run::state_digest() { return fnv1a_digest(state_tensors(), optimizer_->step_count()); }

std::string Run::sync_state_digest() {
  std::vector<at::Tensor> tensors;
  for (const ExtraState& extra : sync_->state()) tensors.insert(tensors.end(), extra.tensors.begin(), extra.tensors.end());
  return tensors.empty() ? "" : fnv1a_digest(tensors, 0);
}

}  // namespace crosstrain::train
