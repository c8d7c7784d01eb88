#include "crosstrain/train/dlrm_trainer.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/ctr.h"
#include "crosstrain/obs/trace.h"
#include "crosstrain/recsys/dlrm.h"
#include "crosstrain/recsys/metrics.h"
#include "crosstrain/recsys/sharded_embedding.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/lr_schedule.h"
#include "crosstrain/train/trainer.h"
#include "dlrm_parts.h"

namespace crosstrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

struct DlrmTrainer::State {
  Config c;
  comm::Communicator& world;
  int rank, size;
  int64_t local_batch;
  std::unique_ptr<data::CtrSource> source;
  std::vector<recsys::TableDef> tables;
  std::unique_ptr<recsys::EmbeddingBackend> embeddings;
  std::unique_ptr<DlrmPsSync> ps;  // dlrm.mode = "ps": the dense part's parameter server
  recsys::DlrmDense dense{nullptr};
  DenseAdam adam;
  CheckpointWriter checkpoints;

  State(Config config, comm::Communicator& w)
      : c(std::move(config)), world(w), rank(w.rank()), size(w.size()),
        checkpoints(w, c.run.dir, static_cast<int>(c.train.keep_checkpoints), c.train.async_checkpoint,
                    c.comm.timeout_s, c.debug.checkpoint) {}

  data::CtrBatch batch(bool train, int64_t index) {
    const int64_t first = index * c.train.global_batch + rank * local_batch;
    return train ? source->train_batch(first, local_batch) : source->val_batch(first, local_batch);
  }
  // Logits of this rank's examples of a batch, and its labels.
  std::pair<at::Tensor, at::Tensor> forward(const data::CtrBatch& b, bool training) {
    const BatchTensors t = to_tensors(b, c.dlrm.dense_features);
    auto pooled = embeddings->forward(t.ids, t.offsets, training);
    return {dense->forward(t.dense, pooled), t.labels};
  }
  DlrmStep train_step(int64_t step);
  std::pair<double, double> evaluate();
  double planted_auc();
  void save(int64_t step, bool last);
  int64_t resume();
};

void check_dlrm_config(const Config& c, int world) {
  recsys::check_dlrm(c.dlrm);
  if (c.train.global_batch % world != 0)
    throw UsageError("train.global_batch = " + std::to_string(c.train.global_batch) + " must divide by the " +
                     std::to_string(world) + " ranks (examples per step, split evenly); try " +
                     std::to_string((c.train.global_batch / world + 1) * world));
  if (c.parallel.tp != 1 || c.parallel.pp != 1)
    throw UsageError("model.arch = \"dlrm\" is data parallel with sharded tables: parallel.tp and parallel.pp must be 1");
  if (c.dlrm.mode == "sharded" && c.sync.mode != "sync")
    throw UsageError("sync.mode = '" + c.sync.mode + "' needs dlrm.mode = \"ps\" (tables on the parameter server); "
                     "sharded tables train in lockstep (sync.mode = \"sync\")");
  if (c.dlrm.mode == "ps" && c.sync.mode != "ssp" && c.sync.mode != "async")
    throw UsageError("dlrm.mode = \"ps\" trains with bounded staleness: set sync.mode = \"ssp\" (or \"async\")");
  plan_tables(c, world);  // the sharding fits the budget, column-wise tables are wide enough
  check_cache_budget(c);
}

DlrmTrainer::DlrmTrainer(Config config, comm::Communicator& world)
    : s_(std::make_unique<State>(std::move(config), world)) {
  State& s = *s_;
  check_dlrm_config(s.c, world.size());
  limit_compute_threads(static_cast<int>(s.c.train.threads_per_rank));
  s.local_batch = s.c.train.global_batch / s.size;
  if (s.rank == 0) std::filesystem::create_directories(s.c.run.dir);
  s.source = make_ctr_source(s.c);
  s.tables = plan_tables(s.c, s.size);
  s.embeddings = make_embeddings(s.c, s.tables, world);
  s.dense = recsys::DlrmDense(s.c.dlrm, s.c.run.seed);
  s.adam = DenseAdam(s.dense->named(), s.c.train);
  if (s.c.dlrm.mode == "ps") s.ps = std::make_unique<DlrmPsSync>(s.c, world, s.adam.parameters());
}

DlrmTrainer::~DlrmTrainer() = default;

DlrmStep DlrmTrainer::State::train_step(int64_t step) {
  const auto start = Clock::now();
  world.set_step(step);
  if (ps) ps->before_step(step);
  embeddings->set_step(step);
  const int64_t sent_before = embeddings->bytes_sent();
  auto [logits, labels] = forward(batch(true, step - 1), true);
  // Lockstep: the loss is the mean over the global batch, so summed gradients are the one-process gradients.
  // Parameter server: each worker steps on its own examples.
  const double scale = ps ? static_cast<double>(local_batch) : static_cast<double>(c.train.global_batch);
  at::Tensor loss_sum = torch::binary_cross_entropy_with_logits(logits, labels, {}, {}, at::Reduction::Sum);
  adam.zero_grad();
  loss_sum.div(scale).backward();
  double loss = loss_sum.item<double>();
  if (!ps) {
    loss = all_reduce_sum(world, loss) / scale;
    adam.all_reduce_grads(world);
  } else {
    loss /= scale;
  }
  embeddings->update(step);
  adam.step(learning_rate(step, c.train.warmup_steps, c.train.steps, c.train.lr, c.train.min_lr));
  if (ps) ps->after_step(step, step == c.train.steps);
  DlrmStep rec;
  rec.step = step;
  rec.loss = loss;
  rec.step_time_s = seconds_since(start);
  rec.examples_per_s = static_cast<double>(c.train.global_batch) / rec.step_time_s;
  rec.exchange_bytes = embeddings->bytes_sent() - sent_before;
  return rec;
}

std::pair<double, double> DlrmTrainer::State::evaluate() {
  torch::NoGradGuard no_grad;
  std::vector<float> scores, labels;
  for (int64_t b = 0; b < c.train.eval_batches; ++b) {
    auto [logits, y] = forward(batch(false, b), false);
    const at::Tensor all_logits = all_gather_flat(world, logits.contiguous());
    const at::Tensor all_labels = all_gather_flat(world, y.contiguous());
    scores.insert(scores.end(), all_logits.data_ptr<float>(), all_logits.data_ptr<float>() + all_logits.numel());
    labels.insert(labels.end(), all_labels.data_ptr<float>(), all_labels.data_ptr<float>() + all_labels.numel());
  }
  return {recsys::roc_auc(scores, labels), recsys::log_loss(scores, labels)};
}

// The held-out examples evaluate() scores, scored by the logits the generator planted (no communication).
double DlrmTrainer::State::planted_auc() {
  const int64_t n = c.train.eval_batches * c.train.global_batch;
  const auto logits = data::synthetic_ctr_logits(synthetic_config(c), 0, n, /*held_out=*/true);
  std::vector<float> labels;
  for (int64_t b = 0; b < c.train.eval_batches; ++b) {
    const auto part = source->val_batch(b * c.train.global_batch, c.train.global_batch).labels;
    labels.insert(labels.end(), part.begin(), part.end());
  }
  return recsys::roc_auc(logits, labels);
}

void DlrmTrainer::State::save(int64_t step, bool last) {
  // Parameter server: every worker has pushed step `step` (and waits in the commit's collectives until every
  // rank copied its shards), so the saved tables hold exactly the pushes of steps up to `step`.
  if (ps && !last && size > 1) world.barrier()->wait();
  checkpoints.save(step, checkpoint_pieces(tables, *embeddings, adam, rank, size),
                   checkpoint_info(c, step, size, tables));
  checkpoints.commit();
}

int64_t DlrmTrainer::State::resume() {
  const auto latest = checkpoint::latest_checkpoint(c.run.dir);
  if (!latest) throw UsageError("--resume: no checkpoint in '" + c.run.dir + "/checkpoints'");
  checkpoint::CheckpointReader reader(*latest);
  check_resume_step(*latest, reader.step(), c.train.steps);
  load_checkpoint(reader, tables, *embeddings, adam, rank, size);
  return reader.step() + 1;
}

DlrmResult DlrmTrainer::run(const DlrmOptions& options) {
  State& s = *s_;
  DlrmResult result;
  for (const auto& t : s.tables) {
    result.table_rows_total += t.rows;
    result.placements.push_back(std::string(recsys::sharding_name(t.placement.sharding)) + ": " + t.placement.reason);
  }
  result.table_bytes_this_rank = s.embeddings->bytes();
  result.tables_in_files = s.c.dlrm.mode == "ps" && s.c.dlrm.ps_storage == "mmap";
  const bool talk = s.rank == 0 && !options.quiet;
  if (talk) print_dlrm_header(s.c, s.size, s.source->describe(), result);
  const int64_t first = options.resume ? s.resume() : 1;
  // Nobody asks for rows before every rank has built (and, resuming, loaded) the shards it serves.
  if (s.size > 1) s.world.barrier()->wait();
  if (s.ps) s.ps->start(first);
  MetricsFile metrics(s.rank == 0 ? s.c.run.dir + "/metrics.jsonl" : "", first > 1);
  for (int64_t step = first; step <= s.c.train.steps; ++step) {
    DlrmStep rec = s.train_step(step);
    result.steps.push_back(rec);
    const bool last = step == s.c.train.steps;
    const bool eval = last || (s.c.train.eval_every > 0 && step % s.c.train.eval_every == 0);
    if (eval) std::tie(result.val_auc, result.val_log_loss) = s.evaluate();
    if (eval && result.planted_auc < 0 && s.c.dlrm.data == "synthetic") result.planted_auc = s.planted_auc();
    metrics.write(rec, eval ? result.val_auc : -1, eval ? result.val_log_loss : -1);
    if (talk && (step % s.c.run.log_every == 0 || last || eval)) print_dlrm_step(rec, s.c.train.steps, eval, result);
    // The parameter server's last pushes are all applied once every worker said goodbye: the tables are still.
    if (last) s.embeddings->finish();
    if (last || (s.c.train.checkpoint_every > 0 && step % s.c.train.checkpoint_every == 0)) s.save(step, last);
  }
  summarize(result);
  if (talk) print_dlrm_summary(result);
  if (options.gather_tables) {
    for (size_t t = 0; t < s.tables.size(); ++t)
      result.tables.push_back(gather_table(s.world, s.tables[t], *s.embeddings, static_cast<int>(t)));
    for (const auto& p : s.adam.parameters()) result.dense.push_back(p.detach().clone());
  }
  return result;
}

}  // namespace crosstrain::train
