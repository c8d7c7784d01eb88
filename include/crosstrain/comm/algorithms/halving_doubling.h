// Recursive halving-doubling (HalvingDoublingAlgorithm): the ring's bytes (2(n-1)/n of the buffer per rank in an
// all-reduce) in 2 log2 p steps instead of 2(n-1). All-reduce is Rabenseifner's (recursive halving reduce-scatter,
// then recursive doubling all-gather); broadcast is a binomial scatter then a recursive doubling (van de Geijn).
// Worlds that are not a power of two fold the extra ranks in first (odd ranks below 2(n-p) hand their data to
// their even neighbour) and out at the end. Also the one-shot halving_doubling_all_reduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

class HalvingDoublingAlgorithm : public CollectiveAlgorithm {
 public:
  HalvingDoublingAlgorithm(Communicator& comm, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  // Recursive halving: log2 p exchanges of halving size.
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  // Recursive doubling: log2 p exchanges of doubling size.
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  // Binomial scatter of p pieces, then recursive doubling all-gather (van de Geijn): ~2x the buffer per rank.
  void broadcast(at::Tensor& tensor, int root) override;

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;
};

// One-shot (builds an object for one call; scratch is allocated per call).
void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
