// Embedding tables on the sparse parameter server (dlrm.mode = "ps"): every rank serves row blocks of every
// table (in memory or memory-mapped files) and is a worker that pulls the rows its examples need, through a
// cache of hot rows that may be up to `max_age` steps old (bounded staleness), and pushes their gradients; the
// servers apply the sparse optimizer as pushes arrive. No step waits for another worker's rows.
#pragma once

#include <memory>
#include <vector>

#include "crosstrain/recsys/embedding_backend.h"
#include "crosstrain/recsys/sharded_embedding.h"
#include "crosstrain/recsys/sparse_param_server.h"

namespace crosstrain::recsys {

class PsEmbeddings : public EmbeddingBackend {
 public:
  // `group`: a communicator for the server's traffic alone (a split of the world), owned here.
  PsEmbeddings(std::unique_ptr<comm::Communicator> group, const std::vector<TableDef>& tables,
               const SparseOptimizerConfig& opt, const TableStorage& storage, uint64_t seed, comm::Millis timeout,
               int64_t cache_rows, int64_t max_age, bool mean_pooling);
  ~PsEmbeddings() override;

  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& offsets,
                                  bool training) override;
  void update(int64_t step) override;
  void set_step(int64_t step) override { step_ = step; }
  void finish() override;
  EmbeddingShard* shard(int t) override { return &server_->shard(t); }
  int64_t bytes_sent() const override { return server_->bytes_sent(); }
  int64_t bytes() const override { return server_->server_bytes() + client_->cache().bytes(); }
  const RowCache& cache() const { return client_->cache(); }

 private:
  std::unique_ptr<comm::Communicator> group_;
  std::unique_ptr<SparseParameterServer> server_;
  std::unique_ptr<CachedSparseClient> client_;
  bool mean_pooling_;
  int64_t step_ = 1;
  bool finished_ = false;
  std::vector<at::Tensor> unique_, leaves_;  // of the last training forward
};

}  // namespace crosstrain::recsys
