// Embedding tables sharded over the ranks of a group (TorchRec's ShardedEmbeddingBagCollection, in our terms).
//
// A step, per table: this rank's ids are deduplicated; each unique id is asked of the rank holding it (table-wise:
// the table's owner; row-wise: the owner of its row block; column-wise: every rank, for its block of columns);
// the rows come back, are pooled per example (sum or mean) with autograd on the gathered rows, and after the
// backward their gradients go back the same way. An owner sums the gradients every rank sent for a row and
// applies the sparse optimizer to the touched rows only. Both exchanges are variable-size all-to-alls of every
// table at once (exchange.h): one for the ids, one for the rows, one for the gradients.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/recsys/embedding_backend.h"
#include "crosstrain/recsys/embedding_table.h"
#include "crosstrain/recsys/sharding_plan.h"

namespace crosstrain::recsys {

struct TableDef {
  int64_t rows = 0, dim = 0;
  TablePlacement placement;
};

// Which rows and columns of a table `rank` holds (rows 0 or cols 0: none).
struct ShardExtent {
  int64_t first_row = 0, rows = 0, col_begin = 0, cols = 0;
};
ShardExtent shard_extent(const TableDef& table, int rank, int world);

// A checkpoint's split of a column-wise table (checkpoint::SplitFn): rank's block of columns of `full`.
at::Tensor column_block(const at::Tensor& full, int rank, int size);

struct ExchangeStats {
  int64_t bytes_sent = 0;      // to other ranks: ids, rows and gradients (cumulative)
  int64_t lookups = 0;         // ids looked up by this rank (cumulative)
  int64_t unique_lookups = 0;  // after deduplication per table and step
};

class ShardedEmbeddings : public EmbeddingBackend {
 public:
  // Collective over `group` only in the sense that every rank must build it with the same tables.
  ShardedEmbeddings(comm::Communicator& group, std::vector<TableDef> tables, const SparseOptimizerConfig& opt,
                    const TableStorage& storage, uint64_t seed, bool mean_pooling);
  ~ShardedEmbeddings();

  // Pooled embeddings [batch, dim] per table for this rank's examples (ids and offsets per table, int64; offsets
  // has batch + 1 entries). With `training`, the gathered rows are leaves whose gradients update() sends back.
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& offsets,
                                  bool training) override;
  // After the backward of the last training forward: gradients to their owners, the sparse optimizer on the
  // touched rows (`step`: the optimizer step, from 1).
  void update(int64_t step) override;

  const std::vector<TableDef>& tables() const { return tables_; }
  // This rank's shard of table t, or null when it holds none of it.
  EmbeddingShard* shard(int t) override { return shards_[t].get(); }
  const ExchangeStats& stats() const { return stats_; }
  int64_t bytes() const override;  // weights and optimizer state held here
  int64_t bytes_sent() const override { return stats_.bytes_sent; }

 private:
  struct Pending;  // what a training forward keeps for update()
  std::vector<at::Tensor> route(int t, const at::Tensor& unique_ids) const;  // per destination rank
  at::Tensor serve(int t, const at::Tensor& ids) const;                       // rows of this rank's shard
  at::Tensor assemble(int t, const std::vector<at::Tensor>& parts, int64_t n) const;

  comm::Communicator& group_;
  std::vector<TableDef> tables_;
  std::vector<std::unique_ptr<EmbeddingShard>> shards_;
  bool mean_pooling_;
  std::unique_ptr<Pending> pending_;
  ExchangeStats stats_;
};

}  // namespace crosstrain::recsys
