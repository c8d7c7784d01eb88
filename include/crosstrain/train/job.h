// What the one training loop (train/loop.h) asks of a kind of run.
//
// A Job is one rank's composed run of one model family (GPT and Llama: src/jobs/gpt/run.h; DLRM:
// src/jobs/dlrm/job.h): it knows how to train a step, evaluate, save its state and describe a step. The loop
// decides when each happens and owns everything every run shares: metrics rows, progress, the stop vote, traces
// being flushed, samples. A new model family implements a Job and registers it (jobs/model_family.h); it gets
// all of that without writing a loop.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/sync_mode.h"

namespace crosstrain::train {

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;
  double step_time_s = 0;
  double tokens_per_s = 0;  // DLRM: examples per second (an example is its unit of work)
  double comm_time_s = 0;
  double exposed_comm_time_s = 0;
  int64_t local_batch = 0;  // sequences this rank's replica trained on (its share of the global batch)
};

// Held-out figures of one evaluation: the loss the loop logs as val_loss, and what a family adds (DLRM's AUC).
struct Evaluation {
  double loss = -1;  // -1: no evaluation this step
  std::map<std::string, double> extra;
  bool done() const { return loss >= 0; }
};

// Everything a replica needs to continue: carried across elastic generations, or sent to a joining replica.
struct LiveState {
  std::vector<at::Tensor> tensors;  // the job's live tensors (model and optimizer state), kept alive by the caller
  int64_t optimizer_steps = 0;
  int64_t next_step = 1;
  bool valid() const { return !tensors.empty(); }
};

struct HealStats {
  int64_t bytes = 0;   // state bytes sent to each receiver
  double seconds = 0;  // the transfer, once both sides are there, to the last byte
};

class Job {
 public:
  virtual ~Job() = default;

  // The first step this rank trains (after a resume or a heal: the one after the state it holds).
  virtual int64_t start_step() const = 0;
  // Names the step in every later error of this rank's communicators.
  virtual void set_step(int64_t step) = 0;
  // When the ranks hear a Ctrl-C together (SyncTraits::stop_check says how each sync mode chooses it, so that the
  // vote costs no waiting the mode does not do anyway).
  virtual StopCheck stop_check() const = 0;
  // Where stop_check().every is 0 (async): this rank was asked to stop, and whether any rank was, as far as this
  // one has heard (train/stop_vote.h, HeardStop).
  virtual void ask_to_stop() {}
  virtual bool stop_heard() const { return false; }
  virtual void print_header() const = 0;

  // One training step. `before_commit` runs once the gradients are reduced and before the optimizer changes
  // anything (elastic: the step's vote; it throws to abandon the step).
  virtual StepRecord train_step(int64_t step, const std::function<void()>& before_commit) = 0;
  // When the last train_step() threw after `before_commit` returned (a failure in the step's own exchange after
  // the update, such as DiLoCo's outer step): the step's record as far as it got (loss, lr, gradient norm, no
  // times). Elastic training writes that step's metrics row from it in the next generation.
  virtual std::optional<StepRecord> voted_record() const { return std::nullopt; }

  // Whether the job has held-out data, and whether it evaluates after the last step even with
  // train.eval_every = 0 (DLRM reports its final AUC).
  virtual bool has_validation() const = 0;
  virtual bool evaluates_last_step() const { return false; }
  virtual Evaluation evaluate() = 0;

  // Saves on schedule (train.checkpoint_every) and after the last step; returns the checkpoint committed now.
  virtual std::string checkpoint(int64_t step) = 0;
  // Commits an asynchronous save already written (stopping between steps: nothing new is started).
  virtual std::string commit_pending() = 0;
  // Saves the state after `step` now, whatever the schedule, and commits it (a run stopped between steps keeps
  // its work). Collective, like checkpoint().
  virtual std::string save_now(int64_t step) = 0;
  // Collective, once the run's last save is committed: waits until its checkpoints have reached every site
  // (run.site, site_stager.h); throws Error when they could not.
  virtual void drain_checkpoints() {}

  // The step's metrics row: the loop has filled the common fields (step, loss, lr, throughput, times, the
  // evaluation, local_batch, peak_rss_bytes); the family adds its own. `elapsed_s`: since the run started.
  virtual void add_metrics(obs::StepMetrics& m, const StepRecord& rec, double elapsed_s) = 0;
  // Appends buffered trace spans to traces/rank-R.json (every obs.trace_flush_every steps, and at the end).
  virtual void flush_trace() = 0;

  // After the last step, once every rank got there (DLRM: the parameter server's last pushes are applied).
  virtual void finish() {}
  // Text generated from the final checkpoint (rank 0; train.sample_tokens); empty for families without text.
  virtual std::string sample() { return ""; }

  // ---- elastic training (jobs/gpt/elastic.h) ----------------------------------------------------------
  // This rank's live state, to continue at `next_step` (references into the job); invalid (no tensors) for a
  // family whose state no other replica holds (DLRM's table shards: a failure goes back to the checkpoint).
  virtual LiveState live_state(int64_t next_step) = 0;
  // Whether the replicas agree after the step just trained (DiLoCo: it took an outer step; every step for the
  // modes that agree each step): elastic joins may wait for it (elastic.join_at_outer_steps).
  virtual bool at_sync_boundary() const { return true; }
  // This rank's data-parallel index in the generation: heals are addressed by it.
  virtual int dp_index() const { return 0; }
  // Loads the newest checkpoint of run.dir (no live replica holds the state); start_step() follows it.
  virtual void load_latest_checkpoint() {
    throw Error("elastic training: this job cannot load a checkpoint by itself (a bug: its family is not elastic)");
  }
  // Takes over `from` (the state this rank carried from its last generation, same layout).
  virtual void adopt(const LiveState& from) { no_live_state(); }
  // Replica `donor` sends its state and step to the `receivers` (data-parallel indices); see Run::heal_from.
  virtual HealStats heal_from(int donor, const std::vector<int>& receivers, int64_t& next_step,
                              const std::function<void()>& midway) {
    no_live_state();
    return {};
  }
  // Every rank, once the generation's state is in place (adopted, healed or loaded) and before its first step,
  // `first_step`: the sync strategy rebuilds what spans the replicas from it (the parameter server of ssp and
  // async re-shards over the live workers). `received`: this rank's state came from another replica (a joiner).
  // Collective over the generation.
  virtual void state_in_place(int64_t first_step, bool received) {}
  // FNV-1a digests of the live state and of the sync strategy's own ("" when it keeps none), for tests.
  virtual std::string state_digest() { return ""; }
  virtual std::string sync_state_digest() { return ""; }

 private:
  [[noreturn]] static void no_live_state() {
    throw Error("elastic training: this model family keeps no live state to carry or send (a bug: its "
                "live_state() is invalid, so nothing should ask)");
  }
};

}  // namespace crosstrain::train
