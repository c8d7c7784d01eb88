// Private to src/train: one rank's composed run (the Trainer runs one; elastic training one per generation).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <set>
#include <string>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/diagnostics/flight_recorder.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/models/parallelize.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/obs/straggler.h"
#include "crosstrain/obs/trace.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/job.h"
#include "crosstrain/train/optimizer.h"
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/sync_mode.h"
#include "crosstrain/jobs/trainer.h"
#include "crosstrain/ledger/work_log.h"
#include "peak_flops.h"
#include "crosstrain/train/recording.h"

namespace crosstrain::train {

struct ParameterDump;

// Checks across keys and against the world size; ParallelDims and the model's plan check the layout.
parallel::ParallelDims validate(const Config& c, int world);

// Where a Run starts. The defaults are a plain run; elastic training (elastic_trainer.cpp) builds a Run per
// generation of its membership and fills the rest.
struct RunStart {
  bool resume = false;            // load the newest checkpoint of run.dir
  bool refuse_old_run_dir = true; // a run.dir with checkpoints needs resume (elastic: resumes by itself)
  // Data order (elastic: this replica's place in the full job, which keeps the sampler's order when replicas
  // leave): rank i of replica `slot` reads data slot `first_slot + i` of `slots` (the full job's data-parallel
  // ranks). -1: the mesh's own data-parallel index and size.
  int slot = -1, first_slot = 0, slots = -1;
  // Data-parallel ranks of this replica (elastic: a copy of ZeRO's state under HSDP, or a DiLoCo cluster, whose
  // sizes may differ): rank i of a replica heals from rank i (modulo its size) of the donor replica.
  int replica_width = 1;
  GemmPeak peak;                  // measured once per process (elastic: before it joins); empty: measure now
};

// One rank's composed run of a GPT or Llama model: layout, model, sync strategy, optimizer, data and checkpoints,
// built once. The training loop (train/loop.h) drives it as a Job.
class Run : public Job {
 public:
  // `dims`: the layout `c` resolved to for `world` (validate(), or resolve() above it): not worked out again.
  Run(const Config& c, const parallel::ParallelDims& dims, comm::Communicator& world, const TrainOptions& options,
      const RunStart& start = {});
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;
  // ---- Job ---------------------------------------------------------------------------------------------
  int64_t start_step() const override { return start_step_; }
  StepRecord train_step(int64_t step, const std::function<void()>& before_commit) override;
  std::optional<StepRecord> voted_record() const override { return voted_; }
  bool has_validation() const override { return c_.data.val_fraction > 0; }
  Evaluation evaluate() override;
  std::string checkpoint(int64_t step) override;  // returns the directory committed this step, if any
  void add_metrics(obs::StepMetrics& m, const StepRecord& rec, double elapsed_s) override;
  void print_header() const override;
  std::string commit_pending() override { return checkpoints_.pending() ? checkpoints_.commit() : ""; }
  void drain_checkpoints() override { checkpoints_.drain(); }
  std::string save_now(int64_t step) override;
  void set_step(int64_t step) override;
  StopCheck stop_check() const override { return sync_traits_.stop_check; }
  void ask_to_stop() override { sync_->ask_to_stop(); }
  bool stop_heard() const override { return sync_->stop_heard(); }
  void finish() override { fill_dump(); }
  std::string sample() override;
  // Appends the buffered spans to the trace file now (the end of a run; every obs.trace_flush_every steps).
  void flush_trace() override;
  // This rank's model and optimizer state (references into this Run), to continue at `next_step`.
  LiveState live_state(int64_t next_step) override;

  void fill_dump();  // tests: options.dump, when the run ends
  at::ScalarType compute_dtype() const { return c_.train.precision == "bf16" ? at::kBFloat16 : at::kFloat; }
  void resume();
  // train.freeze / LoRA: these parameters get no gradient and no optimizer state (and, with bf16, the compute
  // dtype the optimizer gives the trained ones).
  void freeze(const std::set<std::string>& frozen);
  double peak_flops() const { return peak_flops_; }
  // Observability (docs/observability.md): the trace of this rank (null when obs.trace = false) and the flight
  // recorder of its communicators.
  obs::Tracer* tracer() { return recording_.tracer(); }
  comm::FlightRecorder& recorder() { return recording_.recorder(); }

  // ---- elastic training -------------------------------------------------------------------------------
  // Takes over `from` (a Run of the same rank layout): copies its tensors into this Run's.
  void adopt(const LiveState& from) override;
  // Replica `donor` sends its state and step to the `receivers` (data-parallel indices), point to point; the
  // other replicas take no part. A replica of several data-parallel ranks (RunStart::replica_width) heals rank by
  // rank: rank i of the donor sends to rank i of each receiving replica (ZeRO: the same shard); replicas of
  // different sizes (DiLoCo clusters, no ZeRO) pair rank i with the donor's rank i modulo its size. Stats are the
  // donor's (sent) or the receiver's (received). `midway` runs on a
  // receiver between the step and the state (a test's fault: a joiner that dies while it heals).
  HealStats heal_from(int donor, const std::vector<int>& receivers, int64_t& next_step,
                      const std::function<void()>& midway = {}) override;
  // FNV-1a over the live state (tests check that healed replicas match bit for bit).
  std::string state_digest() override;
  // The same over the sync strategy's state alone (DiLoCo: the outer parameters and momentum, which every cluster
  // shares); "" when it keeps none.
  std::string sync_state_digest() override;
  int dp_index() const override { return dp_index_; }
  bool at_sync_boundary() const override;
  // The sync strategy starts again from the loaded state (ssp and async: the servers and the last pull).
  void load_latest_checkpoint() override {
    resume();
    sync_->start(start_step_);
  }
  void state_in_place(int64_t first_step, bool received) override { sync_->rebase(first_step, received); }
  // The live state: the optimizer's tensors, then the sync strategy's own (DiLoCo's outer momentum and parameters).
  std::vector<at::Tensor> state_tensors();

 private:
  double forward_backward(bool training);
  // Fills the micro-batches; with a loss mask (prompt/response data) also the ignored targets and the loss
  // weights, from the counted targets of the step's whole global batch (`global_offsets`).
  void load_batches(const data::TokenStream& stream, const data::LossMask& mask,
                    const std::function<std::vector<int64_t>(int64_t)>& offsets_of,
                    const std::function<std::vector<int64_t>()>& global_offsets);
  StatePlacement placement() const;
  SyncSetup sync_setup(const Config& c, comm::Communicator& world);
  void start_trace(const RunStart& start);
  // Writes the checkpoint of `step` (committed at once when `commit`; else by the next commit_pending()).
  std::string save(int64_t step, bool commit);
  bool spans_clusters(const SyncConfig& s, int cluster_hint);  // collective over the world
  void trace_pipeline_step(int64_t step, int64_t started_us);
  void exchange_straggler_timings(int64_t step);
  StepRecord step_phases(int64_t step, const std::function<void()>& before_commit);
  // run.work_log: whether this rank digests its gradient before the reduction, and the step's line.
  bool digests_gradients() const { return work_log_ && work_log_->writes(); }
  void log_work(int64_t step);

  const Config& c_;
  const SyncTraits sync_traits_;
  // Every operation of the run goes through the recorded world (recording.h); world_ refers to it.
  RunRecording recording_;
  comm::Communicator& world_;
  bool talk_;
  parallel::ParallelDims dims_;
  parallel::Mesh mesh_;
  int dp_index_, tp_index_;
  int replica_width_ = 1;  // RunStart::replica_width
  int64_t exchanges_before_step_ = 0;  // the sync strategy's exchanges when the current step began
  // The data-parallel ranks of each replica of this generation: DiLoCo's clusters, else blocks of replica_width_.
  std::vector<std::vector<int>> replica_groups() const;
  int position_in_replica() const;  // this rank's index in its replica
  void open_work_log(const Config& c);  // run.work_log: this rank's cluster's log of the steps it trained
  data::Splits splits_;
  std::unique_ptr<data::DistributedSampler> sampler_;
  std::vector<int64_t> rank_batches_;  // sequences per step of each replica (sync.cluster_batch); empty: equal
  std::unique_ptr<models::ParallelGPT> model_;
  std::vector<at::Tensor> partial_trainable_;  // sequence parallel: partial gradients summed over tp (not frozen)
  std::unique_ptr<parallel::UnitHooks> unit_hooks_;  // ZeRO-3's, numbered as the model numbers its units
  std::unique_ptr<SyncStrategy> sync_;
  std::unique_ptr<ModelOptimizer> optimizer_;
  CheckpointWriter checkpoints_;
  ParameterDump* dump_;  // tests (test_hooks.h): parameters and last gradients, or null
  int64_t start_step_ = 1;
  int64_t step_ = 0;  // the step in progress (spans of the phases that do not take it)
  std::optional<StepRecord> voted_;  // the step in progress, once its vote passed (voted_record)
  double peak_flops_ = 0;
  double flops_per_token_ = 0;  // of a training step: frozen weights get no weight gradient, adapters count
  int64_t activation_peak_bytes_ = 0;  // of the last training step (core/memory_counter.h)
  int64_t rss_before_model_ = 0;  // RSS (freed memory returned) just before the model was built
  GemmPeak gemm_peak_;  // measured here (empty when given or carried over)
  double sync_blocked_s_ = 0, compute_s_ = 0;  // [sync] for utilization
  // Straggler detection: busy time (step time less the time blocked in waits) since the last exchange.
  obs::StragglerDetector stragglers_;
  std::vector<double> window_busy_s_;  // per step
  int64_t window_first_step_ = 0;
  obs::StragglerVerdict last_verdict_;
  bool verdict_fresh_ = false;
  // run.work_log (ledger/work_log.h): null when off. Every rank defers its gradient reduction to the end of the
  // backward pass then (the same collectives everywhere); the cluster's first rank digests the gradient first.
  std::unique_ptr<WorkLog> work_log_;
  std::string step_digest_;
  int64_t wan_bytes_logged_ = 0;
  // Flat sync all-reduces across clusters when the job spans several (sync.clusters, a topology or the node's
  // cluster variable): only then are its gradient bytes wide-area bytes.
  bool spans_clusters_ = false;  // the strategy's cumulative wide-area bytes at the last logged step
};

}  // namespace crosstrain::train
