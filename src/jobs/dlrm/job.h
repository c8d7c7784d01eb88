// Private to src/train: one rank's DLRM run as a Job of the training loop (train/loop.h): click data by example
// index (every layout reads the same global batch), embedding tables sharded over the ranks with all-to-all
// lookups (dlrm.mode = "sharded") or held by the parameter server with worker caches (dlrm.mode = "ps"), the
// dense part data-parallel, AUC and log-loss on held-out examples.
#pragma once

#include <memory>
#include <utility>

#include "crosstrain/data/ctr.h"
#include "crosstrain/recsys/dlrm.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "crosstrain/train/job.h"
#include "crosstrain/jobs/trainer.h"
#include "parts.h"
#include "crosstrain/train/recording.h"

namespace crosstrain::train {

class DlrmJob : public Job {
 public:
  DlrmJob(const Config& c, comm::Communicator& world, const TrainOptions& options);
  ~DlrmJob() override;

  int64_t start_step() const override { return start_step_; }
  void set_step(int64_t step) override;
  // Parameter-server workers drift apart as their sync mode lets them (model_family.cpp agrees).
  StopCheck stop_check() const override { return ps_ ? sync_traits(c_.sync).stop_check : StopCheck{}; }
  void ask_to_stop() override {
    if (ps_) ps_->ask_to_stop();
  }
  bool stop_heard() const override { return ps_ && ps_->stop_heard(); }
  void print_header() const override;
  StepRecord train_step(int64_t step, const std::function<void()>& before_commit) override;
  bool has_validation() const override { return true; }
  bool evaluates_last_step() const override { return true; }  // the run's result is its final AUC
  Evaluation evaluate() override;
  std::string checkpoint(int64_t step) override;
  std::string commit_pending() override { return checkpoints_.pending() ? checkpoints_.commit() : ""; }
  void drain_checkpoints() override { checkpoints_.drain(); }
  std::string save_now(int64_t step) override;
  void add_metrics(obs::StepMetrics& m, const StepRecord& rec, double elapsed_s) override;
  void flush_trace() override;
  void finish() override;
  // Elastic: the tables are sharded over every rank (or held by every rank's server, dlrm.mode = "ps"), so the
  // whole job is one replica and no other holds its state; a failure takes the job back to its newest checkpoint.
  LiveState live_state(int64_t) override { return {}; }
  int dp_index() const override { return rank_; }
  void load_latest_checkpoint() override;

  // The run so far: steps, the last evaluation, where the tables are (DlrmTrainer's result).
  DlrmResult& result() { return result_; }
  // Collective (tests): every whole table and the dense parameters into the result.
  void gather_tables();

 private:
  data::CtrBatch batch(bool train, int64_t index);
  std::pair<at::Tensor, at::Tensor> forward(const data::CtrBatch& b, bool training);
  double planted_auc();
  int64_t resume();
  std::string save(int64_t step, bool last);  // writes and commits the checkpoint of `step`

  const Config& c_;
  RunRecording recording_;
  comm::Communicator& world_;  // the recorded world
  const bool talk_;
  int rank_, size_;
  int64_t local_batch_;
  std::unique_ptr<data::CtrSource> source_;
  std::vector<recsys::TableDef> tables_;
  std::unique_ptr<recsys::EmbeddingBackend> embeddings_;
  std::unique_ptr<DlrmPsSync> ps_;  // dlrm.mode = "ps": the dense part's parameter server
  recsys::DlrmDense dense_{nullptr};
  DenseAdam adam_;
  CheckpointWriter checkpoints_;
  int64_t start_step_ = 1;
  int64_t step_ = 0;
  // dlrm.mode = "ps": this step's time in the parameter server's pulls, pushes and staleness waits.
  double server_wait_s_ = 0, ignored_wait_s_ = 0;
  DlrmResult result_;
};

}  // namespace crosstrain::train
