// The pairwise all-to-all every algorithm object inherits (CollectiveAlgorithm::all_to_all; BuiltinAlgorithm
// replaces it with the back end's): n-1 steps, at step s rank r sends slice r+s to rank r+s and receives slice r-s
// from rank r-s, so every rank sends and receives (n-1)/n of the buffer. Also its one-shot pairwise_all_to_all.
#include "crosstrain/comm/algorithms/collective_algorithm.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "algorithm_util.h"
#include "crosstrain/comm/algorithms/ring.h"
#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {

using namespace detail;

void CollectiveAlgorithm::all_to_all(const at::Tensor& input, at::Tensor& output) {
  const int n = comm_.size(), r = comm_.rank();
  check_flat("pairwise all-to-all", input);
  check_flat("pairwise all-to-all", output);
  if (input.numel() != output.numel() || input.numel() % n != 0 || input.scalar_type() != output.scalar_type())
    throw UsageError("pairwise all-to-all: input and output must hold size() equal slices of one dtype");
  const int64_t per = input.numel() / n;
  at::Tensor src = input.view({-1}), dst = output.view({-1});
  auto slice = [per](const at::Tensor& t, int i) { return t.slice(0, i * per, (i + 1) * per); };
  slice(dst, r).copy_(slice(src, r));
  if (per == 0) return;
  Links l(comm_, timeout());
  // Step s: send to r+s, receive from r-s; every ordered pair meets exactly once.
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    l.exchange(slice(src, to), to, slice(dst, from), from, tag());
  }
}

void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag) {
  RingAlgorithm(c, with_tag(tag)).all_to_all(in, out);
}

}  // namespace crosstrain::comm::algo
