// Private to src/train: the pieces of the DLRM trainer (dlrm_trainer.cpp), each small and separately readable.
#pragma once

#include <ATen/core/Tensor.h>

#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/communicator.h"
#include "crosstrain/data/ctr.h"
#include "crosstrain/recsys/embedding_backend.h"
#include "crosstrain/recsys/sharded_embedding.h"
#include "crosstrain/train/config.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "crosstrain/sync/strategy.h"

namespace crosstrain::train {

// A batch as tensors: dense [B, F] float, labels [B] float, ids and offsets per table (int64).
struct BatchTensors {
  at::Tensor dense, labels;
  std::vector<at::Tensor> ids, offsets;
};
BatchTensors to_tensors(const data::CtrBatch& b, int64_t dense_features);

// The synthetic generator's settings from [dlrm] and run.seed.
data::SyntheticCtrConfig synthetic_config(const Config& c);
// The data of dlrm.data: the synthetic generator, or a Criteo TSV file.
std::unique_ptr<data::CtrSource> make_ctr_source(const Config& c);
// The planner's placement of every table for `world` ranks (dlrm.mode = "ps": row blocks on every server).
std::vector<recsys::TableDef> plan_tables(const Config& c, int world);
// dlrm.mode = "ps": the worker's cache (dlrm.cache_rows) and, with ps_storage = memory, its server's rows fit
// dlrm.memory_budget_mb. UsageError naming the keys otherwise.
void check_cache_budget(const Config& c);
// Where the tables live (dlrm.mode).
std::unique_ptr<recsys::EmbeddingBackend> make_embeddings(const Config& c, const std::vector<recsys::TableDef>& tables,
                                                          comm::Communicator& world);

// dlrm.mode = "ps" (dlrm_ps.cpp): rows from the parameter server through this worker's cache of hot rows.
std::unique_ptr<recsys::EmbeddingBackend> make_ps_embeddings(const Config& c, const std::vector<recsys::TableDef>& tables,
                                                             const recsys::SparseOptimizerConfig& opt,
                                                             const recsys::TableStorage& storage,
                                                             comm::Communicator& world);

// Adam on the dense parameters (replicated: every rank steps the same summed gradients).
class DenseAdam {
 public:
  DenseAdam() = default;
  DenseAdam(std::vector<std::pair<std::string, at::Tensor>> named, const TrainConfig& t);
  const std::vector<at::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& names() const { return names_; }
  std::vector<at::Tensor>& exp_avg() { return m_; }
  std::vector<at::Tensor>& exp_avg_sq() { return v_; }
  int64_t& steps() { return steps_; }
  void zero_grad();
  void all_reduce_grads(comm::Communicator& world);  // sums every gradient over the ranks (one buffer)
  void step(double lr);

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_, m_, v_;
  double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8, weight_decay_ = 0;
  int64_t steps_ = 0;
};

// dlrm.mode = "ps": the dense parameters through the sync strategy's parameter server (sync.mode ssp or async:
// the ssp wait for the slowest worker before a step, pushes of the local progress after it).
class DlrmPsSync {
 public:
  DlrmPsSync(const Config& c, comm::Communicator& world, std::vector<at::Tensor> dense);
  void start(int64_t first_step);
  void before_step(int64_t step) { strategy_->before_step(step); }
  void after_step(int64_t step, bool last) { strategy_->after_step(step, last); }
  void ask_to_stop() { strategy_->ask_to_stop(); }
  bool stop_heard() const { return strategy_->stop_heard(); }

 private:
  std::vector<at::Tensor> dense_;
  std::unique_ptr<SyncStrategy> strategy_;
};

double all_reduce_sum(comm::Communicator& world, double value);
at::Tensor all_gather_flat(comm::Communicator& world, const at::Tensor& mine);  // equal sizes on every rank
// The whole table t on every rank (each rank adds its shard into zeros, then one all-reduce). Tests, export.
at::Tensor gather_table(comm::Communicator& world, const recsys::TableDef& table, recsys::EmbeddingBackend& emb, int t);

// ---- checkpoints: "embeddings.tT.weight" [rows, dim] (+ "#sum" or "#exp_avg"/"#exp_avg_sq"), "dense.NAME" ----
std::string table_tensor_name(int t);
std::vector<checkpoint::Piece> checkpoint_pieces(const std::vector<recsys::TableDef>& tables,
                                                 recsys::EmbeddingBackend& emb, DenseAdam& adam, int rank, int world);
nlohmann::json checkpoint_info(const Config& c, int64_t step, int world, const std::vector<recsys::TableDef>& tables);
// Loads every tensor this rank holds from `reader` (saved by any number of ranks, any sharding).
void load_checkpoint(checkpoint::CheckpointReader& reader, const std::vector<recsys::TableDef>& tables,
                     recsys::EmbeddingBackend& emb, DenseAdam& adam, int rank, int world);
// The split of a DLRM checkpoint's column-wise pieces (checkpoint::SplitFn).
checkpoint::SplitFn dlrm_split();

// ---- output -------------------------------------------------------------------------------------------------
void print_dlrm_header(const Config& c, int world, const std::string& data, const DlrmResult& r);
void print_dlrm_step(const DlrmStep& s, int64_t steps, bool eval, const DlrmResult& r);
// Fills the run's summary fields of `r` from its steps and this process.
void summarize(DlrmResult& r);
// One line that benchmarks parse: "done: ... examples_per_s=... exchange_bytes_per_step=... ...".
void print_dlrm_summary(const DlrmResult& r);
// run.dir/metrics.jsonl, one line a step (rank 0; empty path: nothing written).
class MetricsFile {
 public:
  MetricsFile(const std::string& path, bool append);
  void write(const DlrmStep& s, double val_auc, double val_log_loss);

 private:
  std::ofstream out_;
};

}  // namespace crosstrain::train
