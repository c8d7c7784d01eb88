// BuiltinAlgorithm: the back end's own collectives (Gloo, MPI, ...) behind the CollectiveAlgorithm interface, so
// that `builtin` can be chosen, benchmarked and compared like our algorithms. It costs what the back end costs and
// uses no scratch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

// The back end's own collectives behind the same interface (waits with the object's timeout).
class BuiltinAlgorithm : public CollectiveAlgorithm {
 public:
  BuiltinAlgorithm(Communicator& comm, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void all_to_all(const at::Tensor& input, at::Tensor& output) override;

 protected:
  int64_t scratch_need(int64_t, int64_t) const override { return 0; }
};

}  // namespace crosstrain::comm::algo
