// BuiltinAlgorithm: every call goes to the back end's own collective and waits for it with the object's timeout
// (no scratch, no point-to-point of ours); its cost is the back end's.
#include "crosstrain/comm/algorithms/builtin.h"

#include <ATen/core/Tensor.h>

namespace crosstrain::comm::algo {

BuiltinAlgorithm::BuiltinAlgorithm(Communicator& comm, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Builtin, comm, options) {}

void BuiltinAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) { comm_.all_reduce(t, op)->wait(timeout()); }

void BuiltinAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  comm_.reduce_scatter(in, out, op)->wait(timeout());
}

void BuiltinAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) { comm_.all_gather(in, out)->wait(timeout()); }

void BuiltinAlgorithm::broadcast(at::Tensor& t, int root) { comm_.broadcast(t, root)->wait(timeout()); }

void BuiltinAlgorithm::all_to_all(const at::Tensor& in, at::Tensor& out) { comm_.all_to_all(in, out)->wait(timeout()); }

}  // namespace crosstrain::comm::algo
