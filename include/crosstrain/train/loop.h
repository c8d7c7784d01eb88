// The training loop: the one place that decides, step by step, when a job evaluates, saves, writes its metrics
// row and prints progress; that runs the Ctrl-C stop vote; and that ends a run (summary, sample). Every kind of
// run goes through it: a plain run (Trainer), each generation of an elastic job (jobs/gpt/elastic.h), DLRM.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/job.h"
#include "crosstrain/train/options.h"

namespace crosstrain::obs {
class MetricsWriter;
class MetricsServer;
}  // namespace crosstrain::obs

namespace crosstrain::train {

// What a driver adds around each step (elastic training: injected faults, the step's vote, a new generation).
struct StepHooks {
  std::function<void(int64_t step)> before_step;
  std::function<void(int64_t step)> before_commit;  // inside the step, before the optimizer changes anything
  std::function<void(int64_t step)> committed;      // the step's update is applied (before evaluation and saves)
  std::function<bool(int64_t step)> keep_going;     // after the step's outputs; false leaves the loop
};

enum class LoopEnd { Finished, Stopped, LeftByHook };

class TrainLoop {
 public:
  TrainLoop(const Config& c, const TrainOptions& options);
  ~TrainLoop();
  TrainLoop(const TrainLoop&) = delete;
  TrainLoop& operator=(const TrainLoop&) = delete;

  // On the rank that writes the run's outputs (rank 0 of the current world): the resolved config.toml,
  // metrics.jsonl (rows from `first_step` on are replaced: a resumed run rewrites what came after its checkpoint)
  // and the live metrics endpoint (obs.metrics_port). `tolerate_busy_port`: a port still held by an earlier rank 0
  // (elastic) costs the endpoint, not the run.
  void open_outputs(int64_t first_step, bool tolerate_busy_port = false);
  // This process no longer writes the outputs (elastic: another rank became rank 0).
  void close_outputs();

  // Trains `job` from `first` to train.steps over `world` (the job's world: its stop vote runs there).
  LoopEnd run(Job& job, comm::Communicator& world, int64_t first, const StepHooks& hooks = {});
  // After the last step: the job's own end, the summary line and the sample (rank 0).
  void finish(Job& job, bool leader);
  // After a stop vote: commits an asynchronous save already written and saves the last step done, unless it
  // saved on schedule, so that a resume continues where the run stopped. Collective.
  void finish_stopped(Job& job, bool leader);

  TrainResult& result() { return result_; }
  double elapsed_s() const;
  // Whether the loop evaluates or saves a checkpoint after `step`, or ends there (elastic training waits for the
  // fate of such a step before its update, so that nothing uncommitted is saved or reported as evaluated).
  bool step_has_outputs(const Job& job, int64_t step) const;
  // Evaluates, saves and writes the row of `rec`'s step again (elastic: a failure ended the generation after the
  // step committed, before or during its outputs). Collective, like the step's own outputs.
  void redo_outputs(Job& job, const StepRecord& rec, bool leader) { step_outputs(job, rec, leader); }
  // The newest step whose metrics row was in metrics.jsonl when open_outputs() opened it (0: none, or not open).
  int64_t metrics_last_kept_step() const;

 private:
  // The evaluate / checkpoint / metrics-row sequence after each trained step: the only place it is written.
  void step_outputs(Job& job, const StepRecord& rec, bool leader);
  bool evaluation_due(const Job& job, int64_t step) const;
  void say_saved(const std::string& dir, bool leader) const;

  const Config& c_;
  const TrainOptions& options_;
  std::unique_ptr<obs::MetricsWriter> metrics_;
  std::unique_ptr<obs::MetricsServer> live_metrics_;
  bool config_written_ = false;
  obs::ProgressPrinter progress_;
  std::chrono::steady_clock::time_point start_;
  TrainResult result_;
  int64_t first_step_ = 1;  // of the last run(): a stop before it trained anything has nothing to save
};

}  // namespace crosstrain::train
