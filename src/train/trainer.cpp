#include "crosstrain/train/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/obs/metrics_server.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/sample.h"
#include "crosstrain/train/stop_vote.h"
#include "run.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;


namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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
  const bool leader = world.rank() == 0, talk = leader && !options.quiet;
  limit_compute_threads(static_cast<int>(c.train.threads_per_rank));
  keep_freed_memory_for_reuse();
  RunStart start;
  start.resume = options.resume;
  Run run(c, world, options, start);

  std::unique_ptr<obs::MetricsWriter> metrics;
  std::unique_ptr<obs::MetricsServer> live_metrics;  // obs.metrics_port: the same rows over HTTP
  if (leader) {
    fs::create_directories(c.run.dir);
    std::ofstream(fs::path(c.run.dir) / "config.toml") << to_toml(c);
    metrics = std::make_unique<obs::MetricsWriter>((fs::path(c.run.dir) / "metrics.jsonl").string(),
                                                   options.resume ? run.start_step() : 0);
    live_metrics = obs::start_metrics_server(c.obs, options.quiet);
  }
  run.print_header();
  obs::ProgressPrinter progress(options.progress_bar);

  TrainResult result;
  // Ctrl-C stops lockstep training between steps (see stop_vote.h for why only sync.mode = "sync").
  StopVote stop_vote(world, run.lockstep() ? options.stop_requested : nullptr);
  const auto run_start = Clock::now();
  for (int64_t step = run.start_step(); step <= c.train.steps; ++step) {
    run.set_step(step);
    if (stop_vote.agreed()) {
      result.stopped_after = step - 1;
      break;
    }
    stop_vote.post();
    const StepRecord rec = run.train_step(step);
    result.steps.push_back(rec);
    double val_loss = -1;
    if (c.train.eval_every > 0 && (step % c.train.eval_every == 0 || step == c.train.steps) && c.data.val_fraction > 0)
      val_loss = result.val_loss = run.evaluate();
    const auto checkpoint_start = Clock::now();
    const std::string saved = run.checkpoint_hooks(step);
    if (!saved.empty() && talk && !options.progress_bar) std::printf("saved checkpoint %s\n", saved.c_str());
    if (!leader) continue;
    const obs::StepMetrics m = run.metrics(rec, val_loss, seconds_since(checkpoint_start), seconds_since(run_start));
    metrics->write(obs::metrics_row(m));
    if (live_metrics) live_metrics->publish(m);
    if (!options.quiet && (step % c.run.log_every == 0 || step == c.train.steps || val_loss >= 0)) progress.print(m);
  }
  stop_vote.finish();
  if (result.stopped_after >= 0) {
    // Stopped between steps: an asynchronous save already written is committed; nothing new is started.
    const std::string saved = run.commit_pending();
    if (talk) progress.finish();
    if (!saved.empty() && talk && !options.progress_bar) std::printf("saved checkpoint %s\n", saved.c_str());
    std::fflush(stdout);
    return result;
  }
  if (talk)
    std::printf("trained %lld steps in %.1f s\n", static_cast<long long>(c.train.steps - run.start_step() + 1),
                seconds_since(run_start));
  run.fill_dump();
  // Text comes from the checkpoint saved at the end, which holds the whole model in any layout.
  if (leader && c.train.sample_tokens > 0) {
    result.sample = sample_text(c, *checkpoint::latest_checkpoint(c.run.dir));
    if (talk)
      std::printf("--- sample (%lld tokens) ---\n%s\n---\n", static_cast<long long>(c.train.sample_tokens),
                  result.sample.c_str());
  }
  return result;
}

}  // namespace crosstrain::train
