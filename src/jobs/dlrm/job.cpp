#include "job.h"

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/recsys/metrics.h"
#include "crosstrain/recsys/sharded_embedding.h"
#include "crosstrain/train/lr_schedule.h"
#include "crosstrain/train/resume_check.h"

namespace crosstrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Adds the time of a scope to a total.
class ServerWait {
 public:
  explicit ServerWait(double& total) : total_(total), start_(Clock::now()) {}
  ~ServerWait() { total_ += seconds_since(start_); }
  ServerWait(const ServerWait&) = delete;
  ServerWait& operator=(const ServerWait&) = delete;

 private:
  double& total_;
  Clock::time_point start_;
};

}  // namespace

DlrmJob::DlrmJob(const Config& c, comm::Communicator& world, const TrainOptions& options)
    : c_(c), recording_(c, world, options.hang_doctor), world_(recording_.world()),
      talk_(world.rank() == 0 && !options.quiet), rank_(world.rank()), size_(world.size()),
      checkpoints_(world_, c.run.dir, static_cast<int>(c.train.keep_checkpoints), c.train.async_checkpoint,
                   c.comm.timeout_s, c.debug.checkpoint, c.run.fence, c.run.site) {
  local_batch_ = c_.train.global_batch / size_;
  if (rank_ == 0) std::filesystem::create_directories(c_.run.dir);
  source_ = make_ctr_source(c_);
  tables_ = plan_tables(c_, size_);
  // The parameter server's threads sit in receives all the time: they talk over the plain world, so that the
  // recorder's waits (the step's exposed communication, hang diagnosis) are the training thread's own.
  const bool server = c_.dlrm.on_parameter_server();
  embeddings_ = make_embeddings(c_, tables_, server ? world : world_);
  dense_ = recsys::DlrmDense(c_.dlrm, c_.run.seed);
  adam_ = DenseAdam(dense_->named(), c_.train);
  if (server) ps_ = std::make_unique<DlrmPsSync>(c_, world, adam_.parameters());
  for (const auto& t : tables_) {
    result_.table_rows_total += t.rows;
    result_.placements.push_back(std::string(recsys::sharding_name(t.placement.sharding)) + ": " + t.placement.reason);
  }
  result_.table_bytes_this_rank = embeddings_->bytes();
  result_.tables_in_files = ps_ && c_.dlrm.ps_storage == recsys::TableStorageKind::Mmap;
  if (options.resume) start_step_ = resume();
  // Nobody asks for rows before every rank has built (and, resuming, loaded) the shards it serves.
  if (size_ > 1) world_.barrier()->wait();
  if (ps_) ps_->start(start_step_);
  obs::TraceIdentity id;
  id.dp = size_;
  id.dp_index = rank_;
  recording_.start_trace(id, options.resume);
}

DlrmJob::~DlrmJob() {
  if (recording_.tracer()) flush_trace();
}

void DlrmJob::print_header() const {
  if (talk_) print_dlrm_header(c_, size_, source_->describe(), result_);
}

void DlrmJob::set_step(int64_t step) {
  step_ = step;
  world_.set_step(step);
  recording_.recorder().set_step(step);
}

data::CtrBatch DlrmJob::batch(bool train, int64_t index) {
  const int64_t first = index * c_.train.global_batch + rank_ * local_batch_;
  return train ? source_->train_batch(first, local_batch_) : source_->val_batch(first, local_batch_);
}

// Logits of this rank's examples of a batch, and its labels.
std::pair<at::Tensor, at::Tensor> DlrmJob::forward(const data::CtrBatch& b, bool training) {
  const BatchTensors t = to_tensors(b, c_.dlrm.dense_features);
  std::vector<at::Tensor> pooled;
  {
    ServerWait wait(ps_ && training ? server_wait_s_ : ignored_wait_s_);  // parameter server: the rows' pulls
    pooled = embeddings_->forward(t.ids, t.offsets, training);
  }
  return {dense_->forward(t.dense, pooled), t.labels};
}

StepRecord DlrmJob::train_step(int64_t step, const std::function<void()>& before_commit) {
  using obs::SpanKind;
  const auto start = Clock::now();
  const double blocked_before = recording_.recorder().blocked_seconds();
  server_wait_s_ = 0;
  Phase whole(recording_, SpanKind::Step, "step", step);
  if (ps_) {
    Phase phase(recording_, SpanKind::Sync, "sync.before_step", step);
    ServerWait wait(server_wait_s_);
    ps_->before_step(step);
  }
  embeddings_->set_step(step);
  const int64_t sent_before = embeddings_->bytes_sent();
  at::Tensor logits, labels;
  {
    Phase phase(recording_, SpanKind::Compute, "forward", step);
    std::tie(logits, labels) = forward(batch(true, step - 1), true);
  }
  // Lockstep: the loss is the mean over the global batch, so summed gradients are the one-process gradients.
  // Parameter server: each worker steps on its own examples.
  const double scale = ps_ ? static_cast<double>(local_batch_) : static_cast<double>(c_.train.global_batch);
  at::Tensor loss_sum = torch::binary_cross_entropy_with_logits(logits, labels, {}, {}, at::Reduction::Sum);
  adam_.zero_grad();
  {
    Phase phase(recording_, SpanKind::Compute, "backward", step);
    loss_sum.div(scale).backward();
  }
  double loss = loss_sum.item<double>();
  if (!ps_) {
    Phase phase(recording_, SpanKind::Sync, "sync.after_backward", step);
    loss = all_reduce_sum(world_, loss) / scale;
    adam_.all_reduce_grads(world_);
  } else {
    loss /= scale;
  }
  if (before_commit) before_commit();
  StepRecord rec;
  rec.lr = learning_rate(step, c_.train.warmup_steps, c_.train.steps, c_.train.lr, c_.train.min_lr);
  {
    Phase phase(recording_, SpanKind::Optimizer, "optimizer", step);
    {
      ServerWait wait(ps_ ? server_wait_s_ : ignored_wait_s_);
      embeddings_->update(step);  // parameter server: the pushes of the touched rows
    }
    adam_.step(rec.lr);
  }
  if (ps_) {
    Phase phase(recording_, SpanKind::Sync, "sync.after_step", step);
    ServerWait wait(server_wait_s_);
    ps_->after_step(step, step == c_.train.steps);
  }
  if (!std::isfinite(loss))
    throw Error("step " + std::to_string(step) + ": the loss is " + std::to_string(loss) +
                "; lower train.lr or check the data");
  rec.step = step;
  rec.loss = loss;
  rec.step_time_s = seconds_since(start);
  rec.tokens_per_s = static_cast<double>(c_.train.global_batch) / rec.step_time_s;  // examples
  rec.local_batch = local_batch_;
  // Every wait of the training thread on its communicators: the communication the step could not hide. The
  // parameter server's traffic goes around the recorder (its threads would count their idle receives), so its
  // pulls, pushes and staleness waits are timed here.
  rec.comm_time_s = rec.exposed_comm_time_s =
      recording_.recorder().blocked_seconds() - blocked_before + server_wait_s_;
  DlrmStep s;
  s.step = step;
  s.loss = loss;
  s.step_time_s = rec.step_time_s;
  s.examples_per_s = rec.tokens_per_s;
  s.exchange_bytes = embeddings_->bytes_sent() - sent_before;
  s.comm_time_s = rec.comm_time_s;
  result_.steps.push_back(s);
  if (step % c_.obs.trace_flush_every == 0) flush_trace();
  return rec;
}

Evaluation DlrmJob::evaluate() {
  Phase phase(recording_, obs::SpanKind::Eval, "evaluate", step_);
  torch::NoGradGuard no_grad;
  std::vector<float> scores, labels;
  for (int64_t b = 0; b < c_.train.eval_batches; ++b) {
    auto [logits, y] = forward(batch(false, b), false);
    const at::Tensor all_logits = all_gather_flat(world_, logits.contiguous());
    const at::Tensor all_labels = all_gather_flat(world_, y.contiguous());
    scores.insert(scores.end(), all_logits.data_ptr<float>(), all_logits.data_ptr<float>() + all_logits.numel());
    labels.insert(labels.end(), all_labels.data_ptr<float>(), all_labels.data_ptr<float>() + all_labels.numel());
  }
  result_.val_auc = recsys::roc_auc(scores, labels);
  result_.val_log_loss = recsys::log_loss(scores, labels);
  if (result_.planted_auc < 0 && c_.dlrm.data == "synthetic") result_.planted_auc = planted_auc();
  Evaluation e;
  e.loss = result_.val_log_loss;
  e.extra["val_auc"] = result_.val_auc;
  e.extra["val_log_loss"] = result_.val_log_loss;
  if (result_.planted_auc >= 0) e.extra["planted_auc"] = result_.planted_auc;
  return e;
}

// The held-out examples evaluate() scores, scored by the logits the generator planted (no communication).
double DlrmJob::planted_auc() {
  const int64_t n = c_.train.eval_batches * c_.train.global_batch;
  const auto logits = data::synthetic_ctr_logits(synthetic_config(c_), 0, n, /*held_out=*/true);
  std::vector<float> labels;
  for (int64_t b = 0; b < c_.train.eval_batches; ++b) {
    const auto part = source_->val_batch(b * c_.train.global_batch, c_.train.global_batch).labels;
    labels.insert(labels.end(), part.begin(), part.end());
  }
  return recsys::roc_auc(logits, labels);
}

std::string DlrmJob::checkpoint(int64_t step) {
  Phase phase(recording_, obs::SpanKind::Checkpoint, "checkpoint", step);
  const bool last = step == c_.train.steps;
  // The parameter server's last pushes are all applied once every worker said goodbye: the tables are still.
  if (last) embeddings_->finish();
  if (!last && !(c_.train.checkpoint_every > 0 && step % c_.train.checkpoint_every == 0)) return "";
  return save(step, last);
}

std::string DlrmJob::save_now(int64_t step) {
  Phase phase(recording_, obs::SpanKind::Checkpoint, "checkpoint", step);
  return save(step, step == c_.train.steps);
}

std::string DlrmJob::save(int64_t step, bool last) {
  // Parameter server: every worker has pushed step `step` (and waits in the commit's collectives until every
  // rank copied its shards), so the saved tables hold exactly the pushes of steps up to `step`.
  if (ps_ && !last && size_ > 1) world_.barrier()->wait();
  checkpoints_.save(step, checkpoint_pieces(tables_, *embeddings_, adam_, rank_, size_),
                    checkpoint_info(c_, step, size_, tables_));
  return checkpoints_.commit();
}

void DlrmJob::load_latest_checkpoint() {
  start_step_ = resume();
  if (!ps_) return;
  // As in the constructor: every server holds its loaded rows before anyone asks, and the dense part's servers
  // start from the loaded parameters at the checkpoint's step.
  if (size_ > 1) world_.barrier()->wait();
  ps_->start(start_step_);
}

int64_t DlrmJob::resume() {
  const auto latest = checkpoint::latest_checkpoint(c_.run.dir);
  if (!latest) throw UsageError("--resume: no checkpoint in '" + c_.run.dir + "/checkpoints'");
  check_resume_model(c_, *latest);
  checkpoint::CheckpointReader reader(*latest);
  check_resume_step(*latest, reader.step(), c_.train.steps);
  load_checkpoint(reader, tables_, *embeddings_, adam_, rank_, size_);
  if (talk_) std::printf("resumed from %s (step %lld)\n", latest->c_str(), static_cast<long long>(reader.step()));
  return reader.step() + 1;
}

void DlrmJob::add_metrics(obs::StepMetrics& m, const StepRecord& rec, double) {
  m.unit = "examples";
  const DlrmStep& s = result_.steps.back();
  m.extra["examples_per_s"] = s.examples_per_s;
  m.extra["tokens"] = static_cast<double>(rec.step * c_.train.global_batch);
  m.counts["embedding_bytes_sent"] = s.exchange_bytes;
  m.counts["table_bytes"] = result_.table_bytes_this_rank;
  m.labels["sync_mode"] = to_string(c_.sync.mode);
  m.labels["model"] = models::to_string(c_.model.arch);
  if (recording_.tracer()) m.counts["trace_dropped_events"] = recording_.tracer()->dropped();
  char note[160];
  std::snprintf(note, sizeof note, "embeddings %.1f KiB sent", static_cast<double>(s.exchange_bytes) / 1024);
  m.note = note;
  if (m.val_loss >= 0) {
    std::snprintf(note, sizeof note, " | val auc %.4f log-loss %.4f", result_.val_auc, result_.val_log_loss);
    m.note += note;
    if (result_.planted_auc >= 0) {
      std::snprintf(note, sizeof note, " (the planted signal's auc: %.4f)", result_.planted_auc);
      m.note += note;
    }
  }
}

void DlrmJob::flush_trace() {
  int64_t dense = 0;
  for (const auto& p : adam_.parameters()) dense += 4 * p.numel() * 4;  // weights, gradients and two moments
  recording_.flush_trace(result_.table_bytes_this_rank + dense);
}

void DlrmJob::finish() {
  summarize(result_);
  if (talk_) print_dlrm_summary(result_);
}

void DlrmJob::gather_tables() {
  for (size_t t = 0; t < tables_.size(); ++t)
    result_.tables.push_back(gather_table(world_, tables_[t], *embeddings_, static_cast<int>(t)));
  for (const auto& p : adam_.parameters()) result_.dense.push_back(p.detach().clone());
}

}  // namespace crosstrain::train
