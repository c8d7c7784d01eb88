// What the DLRM trainer needs of wherever its tables live: pooled embeddings for this rank's examples, the
// update after the backward, and the shards held here (checkpoints). Two homes: sharded over the ranks with
// all-to-all exchanges (sharded_embedding.h), or on the parameter server with worker caches (ps_embedding.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "crosstrain/recsys/embedding_table.h"

namespace crosstrain::recsys {

// The pieces both homes share: an id list deduplicated (sorted unique ids, and each id's index among them), and the
// rows gathered for the unique ids pooled per example (sum or mean; offsets: batch + 1 entries), differentiable
// with respect to `rows`.
struct UniqueIds {
  at::Tensor unique, inverse;
};
UniqueIds dedup(const at::Tensor& ids);
at::Tensor pool_bags(const at::Tensor& rows, const at::Tensor& inverse, const at::Tensor& offsets, bool mean);

class EmbeddingBackend {
 public:
  virtual ~EmbeddingBackend() = default;
  // Pooled embeddings [batch, dim] per table (ids and offsets per table, int64; offsets: batch + 1 entries).
  // With `training`, update() later sends the gradients of the rows this forward gathered.
  virtual std::vector<at::Tensor> forward(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& offsets,
                                          bool training) = 0;
  // After the backward of the last training forward; `step` counts optimizer steps from 1.
  virtual void update(int64_t step) = 0;
  // The step the next forward belongs to (a cache's age of rows is counted in steps).
  virtual void set_step(int64_t step) {}
  // The end of training: every exchange of this rank is done (the parameter server says goodbye).
  virtual void finish() {}
  // The shard of table t held by this rank (null: none).
  virtual EmbeddingShard* shard(int t) = 0;
  virtual int64_t bytes_sent() const = 0;  // to other ranks, cumulative
  virtual int64_t bytes() const = 0;       // weights and optimizer state held here
};

}  // namespace crosstrain::recsys
