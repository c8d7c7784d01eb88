// One rank's shard of an embedding table and its sparse optimizer: the rows it holds (a block of rows, or a
// block of columns of every row), kept in memory or in a memory-mapped file, and updated only where a step
// touched them.
//
// Sparse optimizers (FBGEMM's and TorchRec's fused ones, torch.optim.SparseAdam):
//   row-wise Adagrad  one accumulator per row: G_r += mean_j g_rj^2;  w_r -= lr * g_r / (sqrt(G_r) + eps)
//                     (4 bytes of state per row instead of per element: the state of choice for huge tables)
//   Adam              per element, only on touched rows, bias-corrected with the global step (SparseAdam)
// A column shard sees part of each row: row-wise Adagrad's mean needs every column, so the caller sums the
// partial squares across the column shards (`row_square_sums`) before `apply`.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "crosstrain/recsys/dlrm_config.h"

namespace crosstrain::recsys {

struct SparseOptimizerConfig {
  std::string kind = "adagrad";   // adagrad (row-wise) or adam
  double lr = 0.05;
  double eps = 1e-8;
  double beta1 = 0.9, beta2 = 0.999;  // adam
};
void check_sparse_optimizer(const SparseOptimizerConfig& c);  // UsageError naming dlrm.sparse_optimizer etc.

// Where a shard's rows live: anonymous memory, or a file under `dir`, mapped shared, so the kernel pages cold
// rows out and the process's own memory stays small.
struct TableStorage {
  TableStorageKind kind = TableStorageKind::Memory;
  std::string dir;  // mmap: the folder of the files (created); each shard its own file
};

// The initial value of global row `row`, columns [col_begin, col_end), of table `table`: uniform in
// (-1/sqrt(rows), 1/sqrt(rows)) as DLRM initialises, from a counter-based hash of (seed, table, row, column), so
// any shard of any layout starts with the same values as one process holding everything.
void init_rows(at::Tensor out, uint64_t seed, int table, int64_t rows_total, int64_t first_row, int64_t col_begin);

class EmbeddingShard {
 public:
  // Rows [first_row, first_row + rows) and columns [col_begin, col_begin + cols) of table `table`
  // (`rows_total` x `dim`). Initialised by init_rows. With mmap storage the file is created (sparse) and filled.
  EmbeddingShard(int table, int64_t rows_total, int64_t dim, int64_t first_row, int64_t rows, int64_t col_begin,
                 int64_t cols, const SparseOptimizerConfig& opt, const TableStorage& storage, uint64_t seed);
  ~EmbeddingShard();
  EmbeddingShard(const EmbeddingShard&) = delete;
  EmbeddingShard& operator=(const EmbeddingShard&) = delete;

  int table() const { return table_; }
  int64_t first_row() const { return first_row_; }
  int64_t rows() const { return rows_; }
  int64_t col_begin() const { return col_begin_; }
  int64_t cols() const { return cols_; }
  int64_t dim() const { return dim_; }
  int64_t rows_total() const { return rows_total_; }
  bool holds(int64_t row) const { return row >= first_row_ && row < first_row_ + rows_; }

  // The weights [rows, cols] (a view of the storage) and the optimizer's state: adagrad: "sum" [rows];
  // adam: "exp_avg", "exp_avg_sq" [rows, cols]. Checkpoints read and write them in place.
  at::Tensor weight() const { return weight_; }
  std::vector<std::pair<std::string, at::Tensor>> state() const;

  // Rows `local` (int64 indices into this shard, any order, repeats allowed) -> [n, cols] copy.
  at::Tensor lookup(const at::Tensor& local) const;
  // Partial sums of squares per row of `grads` [n, cols] (row-wise Adagrad: the caller adds the other column
  // shards' before apply).
  static at::Tensor row_square_sums(const at::Tensor& grads);
  // One optimizer step on rows `local` (unique) with gradients [n, cols]; `square_sums` [n] (adagrad: the whole
  // row's sum of squares, across every column shard); `step`: the global optimizer step (adam's bias correction).
  void apply(const at::Tensor& local, const at::Tensor& grads, const at::Tensor& square_sums, int64_t step);
  // Bytes of weights and state.
  int64_t bytes() const;
  // Writes dirty mmap pages back (checkpoints do not need it: they copy the tensors).
  void sync();

 private:
  struct Mapping;
  at::Tensor allocate(const std::string& what, std::vector<int64_t> shape);

  int table_;
  int64_t rows_total_, dim_, first_row_, rows_, col_begin_, cols_;
  SparseOptimizerConfig opt_;
  TableStorage storage_;
  std::vector<std::unique_ptr<Mapping>> mappings_;
  at::Tensor weight_, sum_, exp_avg_, exp_avg_sq_;
};

}  // namespace crosstrain::recsys
