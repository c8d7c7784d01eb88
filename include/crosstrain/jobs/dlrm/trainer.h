// Training loop of a DLRM recommendation model (model.arch = "dlrm", docs/recsys.md): click data by example
// index (every layout reads the same global batch), embedding tables sharded over the ranks with all-to-all
// lookups (dlrm.mode = "sharded") or held by the parameter server with worker caches (dlrm.mode = "ps"), the
// dense part data-parallel, AUC and log-loss on held-out examples, checkpoints in the distributed format that
// reload into another number of ranks.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/config.h"

namespace crosstrain::train {

struct DlrmStep {
  int64_t step = 0;
  double loss = 0;              // mean log-loss over the global batch
  double step_time_s = 0;
  double examples_per_s = 0;    // global batch / step time
  int64_t exchange_bytes = 0;   // this rank's bytes sent for embeddings this step (all-to-all or parameter server)
  double comm_time_s = 0;       // the training thread's waits on communication (the parameter server included)
};

struct DlrmResult {
  std::vector<DlrmStep> steps;
  double val_auc = -1, val_log_loss = -1;  // the last evaluation (-1: none)
  double planted_auc = -1;  // synthetic data: the AUC of the planted logits on the same examples (the best possible)
  int64_t table_rows_total = 0;
  int64_t table_bytes_this_rank = 0;       // weights and optimizer state of the tables held here
  bool tables_in_files = false;            // dlrm.ps_storage = mmap: those bytes are in mapped files
  int64_t anonymous_memory_bytes = 0;      // this process's anonymous resident memory at the end
  double median_examples_per_s = 0;        // over the steps after the first
  double mean_exchange_bytes = 0;          // per step, this rank
  std::vector<std::string> placements;     // per table: "row-wise: 410 MB > ..." (the planner's reason)
  std::vector<at::Tensor> tables;          // with DlrmOptions::gather_tables: every whole table, on every rank
  std::vector<at::Tensor> dense;           // with gather_tables: the dense parameters
};

struct DlrmOptions {
  bool resume = false;
  bool quiet = false;
  bool gather_tables = false;  // tests: the whole tables and dense parameters at the end (collective)
};

// Checks a DLRM config for `world` ranks without building anything; UsageError with one clear line.
void check_dlrm_config(const Config& config, int world);

// How a DLRM checkpoint's column-wise pieces split (for reading whole tensors: ckpt export, resharding).
checkpoint::SplitFn dlrm_checkpoint_split();

class DlrmTrainer {
 public:
  DlrmTrainer(Config config, comm::Communicator& world);
  ~DlrmTrainer();
  DlrmResult run(const DlrmOptions& options);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace crosstrain::train
