// Tables beyond one process's memory (issue 18, item 4): a sharded parameter server for embedding tables, and a
// worker-side cache of hot rows with bounded staleness.
//
// Every rank of the group is a server and a worker, on the skeleton every parameter server shares
// (comm/param_server_core.h: a thread per other worker, clocks, goodbye, failures). Each table is split by rows
// over all ranks in contiguous blocks (row_block: the first rows % world ranks one row more); rank r serves its
// blocks as EmbeddingShard objects (whole rows, in memory or in memory-mapped files under storage.dir/rank<r>).
// A server serialises the updates of its shards with the core's mutex.
//
//   pull(ids per table)        one round trip per server holding any of the rows (servers with none: skipped)
//   push(ids, grads, clock)    one round trip per server, every server (a header alone where it holds none of
//                              the rows): the server applies the sparse optimizer to its rows at once and acks
//                              with the clocks of every worker; no barrier across workers.
//
// Wire format, worker w -> server s (tags of this group only):
//   request header  int64 [2 + tables]: type (pull, push, bye), clock, rows asked per table
//   ids             int64 [sum of counts]                  (when the sum is not 0)
//   grads (push)    float [sum over tables of count * dim] (when the sum is not 0)
// server s -> worker w:  pull: rows float [sum of count * dim];  push: ack int64 [3]: version, min clock, slowest.
// Because every push reaches every server, a server hears from every worker at least once a step: its wait for
// the next request is bounded (2 x timeout, the core's) and a worker that vanished is reported.
//
// Every receive and send waits at most the timeout; a failure names the rank, the operation, the server or
// worker and the tables. A server thread's failure is rethrown by the next call of the worker on that rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/param_server_core.h"
#include "crosstrain/recsys/embedding_table.h"
#include "crosstrain/recsys/sharding_plan.h"

namespace crosstrain::recsys {

class SparseParameterServer {
 public:
  // Collective over `group` (a dedicated split: this object uses its point-to-point tags). `tables`: rows and dim
  // of each table (the other TableShape fields are not used). Every rank builds its row blocks of every table,
  // initialised by init_rows from `seed` (so the servers together hold what one process would).
  SparseParameterServer(comm::Communicator& group, const std::vector<TableShape>& tables,
                        const SparseOptimizerConfig& opt, const TableStorage& storage, uint64_t seed,
                        comm::Millis timeout);
  SparseParameterServer(const SparseParameterServer&) = delete;
  SparseParameterServer& operator=(const SparseParameterServer&) = delete;

  // `ids[t]`: global row ids of table t (int64, 1-D, may be empty; pull allows repeats, push needs them
  // unique) -> rows [ids[t].numel(), dim_t] per table, in the order of the ids.
  std::vector<at::Tensor> pull(const std::vector<at::Tensor>& ids);

  struct PushReply {
    int64_t min_clock = 0;  // the slowest worker's clock, as the servers know it (ssp waits on it)
    int slowest = 0;        // its rank
  };
  // Gradients `grads[t]` [ids[t].numel(), dim_t] of rows `ids[t]` (unique per table). Each server applies the
  // sparse optimizer to its rows before it acks (row-wise adagrad over whole rows; adam's step is `clock`, >= 1).
  // `clock`: this worker's step (pushes with an older clock do not lower it).
  PushReply push(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& grads, int64_t clock);
  // The clocks as this rank's server knows them, without communication: every push reaches every server, so an
  // ssp worker may wait here (polling) until its clock - min_clock is within the bound.
  PushReply local_clocks() const;

  // Says goodbye to every server; this rank's server threads end when every other worker said goodbye (each
  // waits at most 2 x timeout). Rethrows a server thread's failure.
  void finish();

  int tables() const { return static_cast<int>(shapes_.size()); }
  int64_t dim(int t) const { return shapes_.at(t).dim; }
  int64_t rows(int t) const { return shapes_.at(t).rows; }
  // This rank's block of table `t` (checkpoints read and write its weight and state in place; take it after
  // finish(), or while no worker pushes).
  EmbeddingShard& shard(int t);
  int64_t bytes_sent() const { return core_.bytes_sent(); }  // requests sent by this worker and replies by its server
  int64_t server_bytes() const;                        // weights and optimizer state held by this rank
  int64_t pushes_applied() const;                      // pushes (of any worker) this rank's server applied

 private:
  enum Type : int64_t { kPull = 1, kPush = 2 };
  struct Routed;  // one call's ids split by server

  Routed route(const std::vector<at::Tensor>& ids, const char* op) const;
  at::Tensor serve_pull(int worker, const std::vector<int64_t>& counts, const at::Tensor& ids);
  void serve_push(int worker, int64_t clock, const std::vector<int64_t>& counts, const at::Tensor& ids,
                  const at::Tensor& grads, at::Tensor& ack);
  void serve(int worker, const at::Tensor& header);
  at::Tensor request_header(int64_t type, int64_t clock, const std::vector<int64_t>& counts) const;
  int64_t rows_elements(const std::vector<int64_t>& counts) const;
  [[noreturn]] void fail(const std::exception& e, const char* op, int server, const std::vector<int64_t>& counts) const;

  int rank_, size_;
  std::vector<TableShape> shapes_;
  SparseOptimizerConfig opt_;
  std::vector<std::unique_ptr<EmbeddingShard>> shards_;  // under core_.mutex()
  comm::ParamServerCore core_;                           // last: its threads stop before the shards go
};

// The worker's cache of hot rows: at most `capacity` rows over all tables (its memory budget), each served for
// `max_age` steps after it was fetched (a row fetched at step f hits at step now while now - f <= max_age: 0
// means only within the step that fetched it). The least recently used row is evicted first. Rows live in one
// preallocated [capacity, largest dim] tensor; an id maps to its slot through a hash map per table.
class RowCache {
 public:
  RowCache(std::vector<int64_t> dims, int64_t capacity, int64_t max_age);

  struct Lookup {
    at::Tensor hit_pos;   // int64 [h]: positions in `ids` of the rows served from the cache
    at::Tensor hit_rows;  // [h, dim]
    at::Tensor miss_pos;  // int64 [m]: positions in `ids` of absent or stale rows
    at::Tensor miss_ids;  // int64 [m]
  };
  // Rows of `ids` (int64, 1-D) of table `table` at step `now`; hits become the most recently used.
  Lookup lookup(int table, const at::Tensor& ids, int64_t now);
  // Stores `rows` [n, dim] of `ids`, fetched at step `now` (replacing older copies), evicting as needed.
  void insert(int table, const at::Tensor& ids, const at::Tensor& rows, int64_t now);
  // Drops the rows of `ids` (e.g. after this worker pushed them and wants its own update at once).
  void invalidate(int table, const at::Tensor& ids);

  int64_t capacity() const { return capacity_; }
  int64_t max_age() const { return max_age_; }
  int64_t size() const { return used_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }        // absent or stale
  int64_t stale() const { return stale_; }          // misses of rows present but older than max_age
  int64_t evictions() const { return evictions_; }
  int64_t bytes() const { return storage_.numel() * 4; }

 private:
  void unlink(int32_t slot);
  void push_front(int32_t slot);
  int32_t take_slot();

  std::vector<int64_t> dims_;
  int64_t capacity_, max_age_;
  at::Tensor storage_;  // [capacity, largest dim]
  std::vector<std::unordered_map<int64_t, int32_t>> slot_of_;  // per table: id -> slot
  std::vector<int32_t> table_, prev_, next_;                   // per slot; LRU list: head_ newest, tail_ oldest
  std::vector<int64_t> id_, fetched_;
  std::vector<int32_t> free_;                                  // slots holding no row
  int32_t head_ = -1, tail_ = -1;
  int64_t used_ = 0, hits_ = 0, misses_ = 0, stale_ = 0, evictions_ = 0;
};

// The trainer's entry point: rows of the unique ids of a step from the cache, pulling only the absent and stale
// ones (in one pull for every table), and pushes forwarded to the server.
class CachedSparseClient {
 public:
  CachedSparseClient(SparseParameterServer& server, int64_t capacity, int64_t max_age);
  // `unique_ids[t]`: the step's distinct ids of table t -> rows [n_t, dim_t] per table.
  std::vector<at::Tensor> rows_for(const std::vector<at::Tensor>& unique_ids, int64_t step);
  SparseParameterServer::PushReply push(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& grads,
                                        int64_t clock) {
    return server_.push(ids, grads, clock);
  }
  RowCache& cache() { return cache_; }
  int64_t rows_pulled() const { return rows_pulled_; }

 private:
  SparseParameterServer& server_;
  RowCache cache_;
  int64_t rows_pulled_ = 0;
};

}  // namespace crosstrain::recsys
