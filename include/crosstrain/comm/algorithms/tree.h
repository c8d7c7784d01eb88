// The binomial tree (TreeAlgorithm): latency-optimal, ceil(log2 n) steps each way, the whole buffer per step.
// All-reduce is a binomial reduce to rank 0 then a binomial broadcast; reduce-scatter a reduce then a binomial
// scatter; all-gather a binomial gather then a broadcast. It also has the rooted reduce, gather and scatter (the
// hierarchical algorithm runs one inside every group), and the one-shot tree wrappers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

class TreeAlgorithm : public CollectiveAlgorithm {
 public:
  TreeAlgorithm(Communicator& comm, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root) override;
  // Binomial reduce: the result lands in `tensor` on root (avg divided there); other buffers are left partial.
  void reduce(at::Tensor& tensor, int root, ReduceOp op);
  // Binomial gather: `output` (size() x input) is filled on root only; other ranks' outputs hold partial slices.
  void gather(const at::Tensor& input, at::Tensor& output, int root);
  // Binomial scatter: `input` (size() x output) is read on root only.
  void scatter(const at::Tensor& input, at::Tensor& output, int root);

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;
};

// --- one-shot wrappers (build an object for one call; scratch is allocated per call) -------------------------
void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag = kDefaultTag);
void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag = kDefaultTag);
void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
