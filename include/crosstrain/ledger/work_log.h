// The per-cluster work log (run.work_log = true; docs/ledger.md, "Claims from training"): while a job trains
// across clusters, the first rank of each cluster (the lowest global rank with that cluster index) appends one
// JSON line per step to RUN_DIR/work/cluster<K>.jsonl:
//   {"step":12,"tokens":1024,"bytes":3571712,"digest":"<64 hex>","time":1796194356.125}
// tokens: what the cluster's data-parallel replicas processed in the step (sequences x block size); bytes: what
// this rank sent to reduce gradients and to synchronise across clusters in the step (tensor- and
// pipeline-parallel traffic is not counted); digest: SHA-256 of this rank's own gradient before any
// data-parallel reduction. `crosstrain ledger claim` turns the lines into signed ledger entries.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

struct WorkRecord {
  int64_t step = 0, tokens = 0, bytes = 0;
  std::string digest;  // hex SHA-256
  double time = 0;     // Unix seconds, when the step was done
};

// RUN_DIR/work/cluster<K>.jsonl, or RUN_DIR/work/NAME.jsonl when the log is named: the scheduler names each
// share's log after its cluster and placement (CROSSTRAIN_WORK_LOG_NAME = "east.a2"), since a cluster's index
// changes from one placement of a job to the next and a re-placed job repeats the steps after its checkpoint.
std::string work_log_path(const std::string& run_dir, int cluster, const std::string& name = "");
// CROSSTRAIN_WORK_LOG_NAME, checked to be a file name; "" when unset.
std::string work_log_name_from_environment();
// The record as one line, without the newline.
std::string work_record_json(const WorkRecord& record);
// The records of a work log, one per step in increasing step order: a resumed run repeats the steps after its
// checkpoint, and the last line of a step wins. An incomplete last line (being written) is left out; a complete
// line that is not a record is an Error naming the file and the line. A missing file is a UsageError.
std::vector<WorkRecord> read_work_log(const std::string& path);

// Hex SHA-256 over the gradients of `parameters`, in order: each defined .grad as fp32, contiguous, on the CPU
// (parameters without a gradient are skipped). The same bytes concatenated give scheduler::ledger_digest's value.
std::string gradient_digest(const std::vector<at::Tensor>& parameters);

// The writer, one per training run on every rank; only the first rank of each cluster writes.
class WorkLog {
 public:
  // Collective over `world` (every rank calls it): each rank gives its cluster (< 0: cluster 0) and the tokens
  // per step it counts for its cluster (one rank per data-parallel replica gives the replica's tokens, the
  // others 0). The first rank of each cluster opens its file for appending (creating RUN_DIR/work).
  static std::unique_ptr<WorkLog> open(comm::Communicator& world, const std::string& run_dir, int cluster,
                                       int64_t counted_tokens_per_step);
  ~WorkLog();
  WorkLog(const WorkLog&) = delete;
  WorkLog& operator=(const WorkLog&) = delete;
  bool writes() const { return fd_ >= 0; }
  int cluster() const { return cluster_; }
  int64_t cluster_tokens_per_step() const { return cluster_tokens_; }
  const std::string& path() const { return path_; }
  // Appends the step's line with one write(2), so a reader never sees half of it; no-op where !writes().
  void record(int64_t step, const std::string& digest, int64_t bytes);

 private:
  WorkLog() = default;
  int fd_ = -1;
  int cluster_ = 0;
  int64_t cluster_tokens_ = 0;
  std::string path_;
};

}  // namespace crosstrain::train
