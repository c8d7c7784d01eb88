#include "crosstrain/train/loop.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/obs/metrics_server.h"
#include "crosstrain/train/stop_vote.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

// The fields every family's metrics.jsonl rows carry.
obs::StepMetrics common_metrics(const StepRecord& rec, const Evaluation& eval, int64_t total_steps) {
  obs::StepMetrics m;
  m.step = rec.step;
  m.total_steps = total_steps;
  m.loss = rec.loss;
  m.val_loss = eval.loss;
  m.lr = rec.lr;
  m.grad_norm = rec.grad_norm;
  m.tokens_per_s = rec.tokens_per_s;
  m.step_time_s = rec.step_time_s;
  m.comm_time_s = rec.comm_time_s;
  m.exposed_comm_time_s = rec.exposed_comm_time_s;
  for (const auto& [key, value] : eval.extra) m.extra[key] = value;
  m.counts["local_batch"] = rec.local_batch;
  m.counts["peak_rss_bytes"] = obs::peak_rss_bytes();
  return m;
}

}  // namespace

TrainLoop::TrainLoop(const Config& c, const TrainOptions& options)
    : c_(c), options_(options), progress_(options.progress_bar), start_(Clock::now()) {}

TrainLoop::~TrainLoop() = default;

double TrainLoop::elapsed_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

void TrainLoop::open_outputs(int64_t first_step, bool tolerate_busy_port) {
  fs::create_directories(c_.run.dir);
  if (!config_written_) std::ofstream(fs::path(c_.run.dir) / "config.toml") << to_toml(c_);
  config_written_ = true;
  metrics_ = std::make_unique<obs::MetricsWriter>((fs::path(c_.run.dir) / "metrics.jsonl").string(), first_step);
  if (live_metrics_) return;
  try {
    live_metrics_ = obs::start_metrics_server(c_.obs, options_.quiet);
  } catch (const UsageError& e) {
    if (!tolerate_busy_port) throw;
    if (!options_.quiet) std::fprintf(stderr, "crosstrain: no live metrics for now: %s\n", e.what());
  }
}

int64_t TrainLoop::metrics_last_kept_step() const { return metrics_ ? metrics_->last_kept_step() : 0; }

void TrainLoop::close_outputs() {
  metrics_.reset();
  live_metrics_.reset();
}

bool TrainLoop::evaluation_due(const Job& job, int64_t step) const {
  if (!job.has_validation()) return false;
  const bool last = step == c_.train.steps;
  const int64_t every = c_.train.eval_every;
  return (every > 0 && (step % every == 0 || last)) || (last && job.evaluates_last_step());
}

bool TrainLoop::step_has_outputs(const Job& job, int64_t step) const {
  const int64_t every = c_.train.checkpoint_every;
  return step >= c_.train.steps || (every > 0 && step % every == 0) || evaluation_due(job, step);
}

void TrainLoop::say_saved(const std::string& dir, bool leader) const {
  if (!dir.empty() && leader && !options_.quiet && !options_.progress_bar) std::printf("saved checkpoint %s\n", dir.c_str());
}

void TrainLoop::step_outputs(Job& job, const StepRecord& rec, bool leader) {
  Evaluation eval;
  if (evaluation_due(job, rec.step)) {
    eval = job.evaluate();
    result_.val_loss = eval.loss;
  }
  const auto checkpoint_start = Clock::now();
  say_saved(job.checkpoint(rec.step), leader);
  if (!leader || !metrics_) return;
  const double checkpoint_s = std::chrono::duration<double>(Clock::now() - checkpoint_start).count();
  const double elapsed = elapsed_s();
  obs::StepMetrics m = common_metrics(rec, eval, c_.train.steps);
  m.extra["checkpoint_s"] = checkpoint_s;
  m.extra["time_s"] = elapsed;
  job.add_metrics(m, rec, elapsed);
  metrics_->write(obs::metrics_row(m));
  if (live_metrics_) live_metrics_->publish(m);
  const bool log_step = rec.step % c_.run.log_every == 0 || rec.step == c_.train.steps || eval.done();
  if (!options_.quiet && log_step) progress_.print(m);
}

LoopEnd TrainLoop::run(Job& job, comm::Communicator& world, int64_t first, const StepHooks& hooks) {
  const bool leader = world.rank() == 0;
  // Ctrl-C stops training at a step every rank agrees on (stop_vote.h says which).
  StopVote stop_vote(world, options_.stop_requested, job.stop_check());
  HeardStop heard_stop(world, options_.stop_requested, job, [&](int64_t s) { return step_has_outputs(job, s); });
  std::function<void()> before_commit;
  int64_t step = first;
  if (hooks.before_commit) before_commit = [&] { hooks.before_commit(step); };
  LoopEnd end = LoopEnd::Finished;
  first_step_ = first;
  for (; step <= c_.train.steps; ++step) {
    job.set_step(step);
    if (stop_vote.agreed(step) || heard_stop.stops_before(step)) {
      result_.stopped_after = step - 1;
      end = LoopEnd::Stopped;
      break;
    }
    stop_vote.post(step);
    if (hooks.before_step) hooks.before_step(step);
    const StepRecord rec = job.train_step(step, before_commit);
    if (hooks.committed) hooks.committed(step);
    result_.steps.push_back(rec);
    step_outputs(job, rec, leader);
    if (hooks.keep_going && !hooks.keep_going(step)) {
      end = LoopEnd::LeftByHook;
      break;
    }
  }
  stop_vote.finish();
  return end;
}

void TrainLoop::finish_stopped(Job& job, bool leader) {
  std::string saved = job.commit_pending();
  // Keep the work: the state after the last step done, unless that step saved on schedule already.
  const int64_t last = result_.stopped_after, every = c_.train.checkpoint_every;
  if (last >= first_step_ && !(every > 0 && last % every == 0)) saved = job.save_now(last);
  job.drain_checkpoints();
  if (leader && !options_.quiet) progress_.finish();
  say_saved(saved, leader);
  job.flush_trace();
  std::fflush(stdout);
}

void TrainLoop::finish(Job& job, bool leader) {
  job.commit_pending();
  job.drain_checkpoints();
  job.finish();
  job.flush_trace();
  const bool talk = leader && !options_.quiet;
  if (talk) std::printf("trained to step %lld in %.1f s\n", static_cast<long long>(c_.train.steps), elapsed_s());
  if (leader && c_.train.sample_tokens > 0) {
    result_.sample = job.sample();
    if (talk && !result_.sample.empty())
      std::printf("--- sample (%lld tokens) ---\n%s\n---\n", static_cast<long long>(c_.train.sample_tokens),
                  result_.sample.c_str());
  }
  std::fflush(stdout);
}

}  // namespace crosstrain::train
