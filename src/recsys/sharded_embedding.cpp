#include "crosstrain/recsys/sharded_embedding.h"

#include <ATen/ATen.h>

#include "crosstrain/core/error.h"
#include "crosstrain/recsys/exchange.h"

namespace crosstrain::recsys {

ShardExtent shard_extent(const TableDef& table, int rank, int world) {
  ShardExtent e;
  switch (table.placement.sharding) {
    case Sharding::Table:
      if (rank == table.placement.owner) e = {0, table.rows, 0, table.dim};
      break;
    case Sharding::Row: {
      const RowRange r = row_block(table.rows, rank, world);
      e = {r.first, r.last - r.first, 0, table.dim};
      break;
    }
    case Sharding::Column: {
      const RowRange c = row_block(table.dim, rank, world);  // columns in blocks, as rows are
      e = {0, table.rows, c.first, c.last - c.first};
      break;
    }
  }
  return e;
}

at::Tensor column_block(const at::Tensor& full, int rank, int size) {
  const RowRange c = row_block(full.size(1), rank, size);
  return full.slice(1, c.first, c.last);
}

// What a training forward leaves for update(): per table, the gathered rows (autograd leaves), where each
// destination's ids start among the unique ids, and what every rank asked of this one.
struct ShardedEmbeddings::Pending {
  std::vector<at::Tensor> leaves;
  std::vector<std::vector<int64_t>> sent_begin;    // [t][r]: first unique id asked of rank r (row/table-wise)
  at::Tensor sent_counts, recv_counts;             // [world, tables] int64
  std::vector<std::vector<at::Tensor>> asked;      // [src][t]: ids rank src asked of this rank
};

ShardedEmbeddings::ShardedEmbeddings(comm::Communicator& group, std::vector<TableDef> tables,
                                     const SparseOptimizerConfig& opt, const TableStorage& storage, uint64_t seed,
                                     bool mean_pooling)
    : group_(group), tables_(std::move(tables)), mean_pooling_(mean_pooling) {
  for (size_t t = 0; t < tables_.size(); ++t) {
    if (tables_[t].placement.sharding == Sharding::Column && tables_[t].dim < group.size())
      throw UsageError("dlrm: table " + std::to_string(t) + " is " + std::to_string(tables_[t].dim) +
                       " wide and cannot give each of " + std::to_string(group.size()) +
                       " ranks a column: shard it by rows or tables (dlrm.sharding)");
    const ShardExtent e = shard_extent(tables_[t], group.rank(), group.size());
    if (e.rows == 0 || e.cols == 0) {
      shards_.push_back(nullptr);
      continue;
    }
    shards_.push_back(std::make_unique<EmbeddingShard>(static_cast<int>(t), tables_[t].rows, tables_[t].dim, e.first_row,
                                                       e.rows, e.col_begin, e.cols, opt, storage, seed));
  }
}

ShardedEmbeddings::~ShardedEmbeddings() = default;

int64_t ShardedEmbeddings::bytes() const {
  int64_t b = 0;
  for (const auto& s : shards_)
    if (s) b += s->bytes();
  return b;
}

// The sorted unique ids of table t split by the rank that serves them: a contiguous run each for table- and
// row-wise tables (owners hold ascending row blocks), all of them for every rank of a column-wise one.
std::vector<at::Tensor> ShardedEmbeddings::route(int t, const at::Tensor& unique_ids) const {
  const int world = group_.size();
  const TableDef& table = tables_[t];
  std::vector<at::Tensor> out(world);
  const at::Tensor none = unique_ids.slice(0, 0, 0);
  switch (table.placement.sharding) {
    case Sharding::Table:
      for (int r = 0; r < world; ++r) out[r] = r == table.placement.owner ? unique_ids : none;
      break;
    case Sharding::Column:
      for (int r = 0; r < world; ++r) out[r] = unique_ids;
      break;
    case Sharding::Row: {
      std::vector<int64_t> starts;
      for (int r = 0; r < world; ++r) starts.push_back(row_block(table.rows, r, world).first);
      const at::Tensor bounds = at::tensor(starts, at::kLong);
      // Index of the first id at or past each rank's first row.
      const at::Tensor cut = at::searchsorted(unique_ids, bounds);
      const int64_t* c = cut.data_ptr<int64_t>();
      for (int r = 0; r < world; ++r) {
        const int64_t end = r + 1 < world ? c[r + 1] : unique_ids.numel();
        out[r] = unique_ids.slice(0, c[r], end);
      }
      break;
    }
  }
  return out;
}

at::Tensor ShardedEmbeddings::serve(int t, const at::Tensor& ids) const {
  const EmbeddingShard* shard = shards_[t].get();
  if (!shard) {
    if (ids.numel() == 0) return at::empty({0, 0}, at::kFloat);
    throw Error("dlrm: rank " + std::to_string(group_.rank()) + " was asked for " + std::to_string(ids.numel()) +
                " rows of table " + std::to_string(t) + ", of which it holds none (the ranks disagree on the sharding)");
  }
  if (ids.numel() > 0) {
    const int64_t lo = ids.min().item<int64_t>(), hi = ids.max().item<int64_t>();
    if (!shard->holds(lo) || !shard->holds(hi))
      throw Error("dlrm: rank " + std::to_string(group_.rank()) + " was asked for row " +
                  std::to_string(shard->holds(lo) ? hi : lo) + " of table " + std::to_string(t) + ", outside its rows [" +
                  std::to_string(shard->first_row()) + ", " + std::to_string(shard->first_row() + shard->rows()) + ")");
  }
  return shard->lookup(ids - shard->first_row());
}

// The rows of table t's unique ids from every rank's answer: row blocks in rank order, or column blocks side by side.
at::Tensor ShardedEmbeddings::assemble(int t, const std::vector<at::Tensor>& parts, int64_t n) const {
  const TableDef& table = tables_[t];
  std::vector<at::Tensor> present;
  for (const auto& p : parts)
    if (p.numel() > 0) present.push_back(p);
  if (present.empty()) return at::zeros({n, table.dim}, at::kFloat);
  return table.placement.sharding == Sharding::Column ? at::cat(present, 1) : at::cat(present, 0);
}

std::vector<at::Tensor> ShardedEmbeddings::forward(const std::vector<at::Tensor>& ids,
                                                   const std::vector<at::Tensor>& offsets, bool training) {
  const int world = group_.size(), tables = static_cast<int>(tables_.size());
  auto p = std::make_unique<Pending>();
  std::vector<at::Tensor> unique(tables), inverse(tables);
  std::vector<std::vector<at::Tensor>> requests(tables);
  at::Tensor counts = at::zeros({world, tables}, at::kLong);
  auto* cp = counts.data_ptr<int64_t>();
  p->sent_begin.assign(tables, std::vector<int64_t>(world, 0));
  for (int t = 0; t < tables; ++t) {
    UniqueIds d = dedup(ids[t]);
    const at::Tensor& u = d.unique;
    unique[t] = d.unique;
    inverse[t] = d.inverse;
    requests[t] = route(t, u);
    int64_t begin = 0;
    for (int r = 0; r < world; ++r) {
      cp[r * tables + t] = requests[t][r].numel();
      p->sent_begin[t][r] = begin;
      if (tables_[t].placement.sharding != Sharding::Column) begin += requests[t][r].numel();
    }
    stats_.lookups += ids[t].numel();
    stats_.unique_lookups += u.numel();
  }
  // 1. The ids: how many of each table every rank asks of every other, then the ids themselves.
  const at::Tensor asked_counts = exchange_counts(group_, counts);
  std::vector<at::Tensor> send(world);
  std::vector<int64_t> recv_numel(world);
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> pieces;
    for (int t = 0; t < tables; ++t) pieces.push_back(requests[t][r]);
    send[r] = at::cat(pieces);
    recv_numel[r] = asked_counts[r].sum().item<int64_t>();
  }
  const std::vector<at::Tensor> asked = all_to_all_v(group_, send, recv_numel, &stats_.bytes_sent);
  // 2. The rows: each rank answers every asker, tables in order; the asker knows how much comes back.
  const auto* ap = asked_counts.data_ptr<int64_t>();
  p->asked.assign(world, std::vector<at::Tensor>(tables));
  std::vector<at::Tensor> answers(world);
  for (int s = 0; s < world; ++s) {
    std::vector<at::Tensor> rows;
    int64_t at_id = 0;
    for (int t = 0; t < tables; ++t) {
      const int64_t n = ap[s * tables + t];
      p->asked[s][t] = asked[s].slice(0, at_id, at_id + n);
      at_id += n;
      rows.push_back(serve(t, p->asked[s][t]).reshape({-1}));
    }
    answers[s] = at::cat(rows);
  }
  std::vector<int64_t> expect(world, 0);
  for (int r = 0; r < world; ++r)
    for (int t = 0; t < tables; ++t) expect[r] += cp[r * tables + t] * shard_extent(tables_[t], r, world).cols;
  const std::vector<at::Tensor> answered = all_to_all_v(group_, answers, expect, &stats_.bytes_sent);
  // 3. Per table: the unique rows, pooled per example (autograd from the gathered rows on).
  std::vector<int64_t> read(world, 0);
  std::vector<at::Tensor> pooled(tables);
  for (int t = 0; t < tables; ++t) {
    std::vector<at::Tensor> parts(world);
    for (int r = 0; r < world; ++r) {
      const int64_t n = cp[r * tables + t], cols = shard_extent(tables_[t], r, world).cols;
      parts[r] = answered[r].slice(0, read[r], read[r] + n * cols).view({n, cols});
      read[r] += n * cols;
    }
    at::Tensor rows = assemble(t, parts, unique[t].numel());
    if (training) rows.requires_grad_(true);
    p->leaves.push_back(rows);
    pooled[t] = pool_bags(rows, inverse[t], offsets[t], mean_pooling_);
  }
  p->sent_counts = counts;
  p->recv_counts = asked_counts;
  pending_ = training ? std::move(p) : nullptr;
  return pooled;
}

void ShardedEmbeddings::update(int64_t step) {
  if (!pending_) throw Error("dlrm: ShardedEmbeddings::update without a training forward before it");
  Pending& p = *pending_;
  const int world = group_.size(), tables = static_cast<int>(tables_.size()), me = group_.rank();
  const auto* cp = p.sent_counts.data_ptr<int64_t>();
  const auto* ap = p.recv_counts.data_ptr<int64_t>();
  // 1. Each gathered row's gradient to the rank it came from (a column-wise table: each rank's columns).
  std::vector<at::Tensor> send(world);
  for (int r = 0; r < world; ++r) {
    std::vector<at::Tensor> pieces;
    for (int t = 0; t < tables; ++t) {
      at::Tensor g = p.leaves[t].grad();
      if (!g.defined()) g = at::zeros_like(p.leaves[t]);
      const ShardExtent e = shard_extent(tables_[t], r, world);
      const int64_t n = cp[r * tables + t];
      at::Tensor part = tables_[t].placement.sharding == Sharding::Column
                            ? g.slice(1, e.col_begin, e.col_begin + e.cols)
                            : g.slice(0, p.sent_begin[t][r], p.sent_begin[t][r] + n);
      pieces.push_back(part.contiguous().view({-1}));
    }
    send[r] = at::cat(pieces);
  }
  std::vector<int64_t> expect(world, 0);
  for (int s = 0; s < world; ++s)
    for (int t = 0; t < tables; ++t) expect[s] += ap[s * tables + t] * shard_extent(tables_[t], me, world).cols;
  const std::vector<at::Tensor> got = all_to_all_v(group_, send, expect, &stats_.bytes_sent);
  // 2. Per table held here: the gradients of every asker summed per row, then the sparse optimizer.
  std::vector<at::Tensor> rows(tables), sums(tables), squares(tables);
  std::vector<int64_t> read(world, 0);
  for (int t = 0; t < tables; ++t) {
    const int64_t cols = shard_extent(tables_[t], me, world).cols;
    std::vector<at::Tensor> ids, grads;
    for (int s = 0; s < world; ++s) {
      const int64_t n = ap[s * tables + t];
      ids.push_back(p.asked[s][t]);
      grads.push_back(got[s].slice(0, read[s], read[s] + n * cols).view({n, cols}));
      read[s] += n * cols;
    }
    if (!shards_[t]) continue;
    const UniqueIds d = dedup(at::cat(ids));
    rows[t] = d.unique;
    sums[t] = at::zeros({d.unique.numel(), cols}, at::kFloat).index_add_(0, d.inverse, at::cat(grads));
    squares[t] = EmbeddingShard::row_square_sums(sums[t]);
  }
  // Row-wise Adagrad on a column-wise table needs the whole row's squares: every rank holds columns of the same
  // (identical, sorted) touched rows, so one all-reduce of every such table's partial sums completes them.
  std::vector<int> column_tables;
  for (int t = 0; t < tables; ++t)
    if (tables_[t].placement.sharding == Sharding::Column) column_tables.push_back(t);
  if (!column_tables.empty() && world > 1) {
    std::vector<at::Tensor> parts;
    for (int t : column_tables) parts.push_back(squares[t]);
    at::Tensor all = at::cat(parts);
    group_.all_reduce(all, comm::ReduceOp::Sum)->wait();
    int64_t at_row = 0;
    for (int t : column_tables) {
      squares[t] = all.slice(0, at_row, at_row + squares[t].numel());
      at_row += squares[t].numel();
    }
  }
  for (int t = 0; t < tables; ++t)
    if (shards_[t]) shards_[t]->apply(rows[t] - shards_[t]->first_row(), sums[t], squares[t], step);
  pending_.reset();
}

}  // namespace crosstrain::recsys
