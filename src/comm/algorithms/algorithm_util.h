// Private to src/comm/algorithms: the helpers more than one algorithm file uses. Reductions of buffers (combine,
// finish_avg), cutting a buffer into even segments, checks of the buffers a call is given, point-to-point with the
// object's timeout (Links), a buffer cut into pieces by member (Pieces), the binomial scatter (tree and
// halving-doubling), and the options of the one-shot wrappers. Defined in algorithm_util.cpp; not part of the
// public API.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo::detail {

// --- reductions of buffers -----------------------------------------------------------------------------------

// acc <- acc op x (elementwise, in place). Avg sums here and divides once at the end.
void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op);
// out <- a op b (out may alias a or b).
void combine_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op);
// Divides the summed `t` by the n ranks when op is Avg (integers: truncating); nothing for the other ops.
void finish_avg(at::Tensor& t, ReduceOp op, int n);

// --- cutting buffers -------------------------------------------------------------------------------------------

// [begin, end) of segment i when `numel` elements are cut into `parts` nearly equal segments.
std::pair<int64_t, int64_t> segment(int64_t numel, int parts, int i);
// The smallest power of two >= n.
int ceil_pow2(int n);

// --- checks of a call's buffers (UsageError) -------------------------------------------------------------------

void check_flat(const char* what, const at::Tensor& t);
// `many` holds n slices of `one.numel()` elements, of one's dtype; both contiguous.
void check_sliced(const char* what, const at::Tensor& one, const at::Tensor& many, int n);

// --- point-to-point --------------------------------------------------------------------------------------------

// Point-to-point with the object's timeout; zero-length messages are skipped by both sides (they compute the
// same lengths).
class Links {
 public:
  Links(Communicator& c, Millis timeout) : c_(c), timeout_(timeout) {}
  WorkPtr post_send(const at::Tensor& t, int to, int tag) { return t.numel() > 0 ? c_.send(t, to, tag) : nullptr; }
  void wait(const WorkPtr& w) {
    if (w) w->wait(timeout_);
  }
  void wait_all(const std::vector<WorkPtr>& ws) {
    for (const auto& w : ws) wait(w);
  }
  WorkPtr post_recv(at::Tensor t, int from, int tag) { return t.numel() > 0 ? c_.recv(t, from, tag) : nullptr; }
  void send(const at::Tensor& t, int to, int tag) { wait(post_send(t, to, tag)); }
  void recv(at::Tensor t, int from, int tag) {
    if (t.numel() > 0) c_.recv(t, from, tag)->wait(timeout_);
  }
  // Send `out` to `to` while receiving `in` from `from`.
  void exchange(const at::Tensor& out, int to, at::Tensor in, int from, int tag) {
    WorkPtr s = post_send(out, to, tag);
    recv(in, from, tag);
    wait(s);
  }

 private:
  Communicator& c_;
  Millis timeout_;
};

using RankOf = std::function<int(int)>;  // member index -> rank of the communicator

// Pieces of a flat buffer by member: piece(a, b) covers members [a, b).
struct Pieces {
  at::Tensor flat;
  const std::vector<int64_t>& offs;
  at::Tensor operator()(int a, int b) const { return flat.slice(0, offs[a], offs[b]); }
};

// --- binomial scatter (the tree's scatter and reduce-scatter, the halving-doubling broadcast) ------------------
// A binomial tree over members 0..m-1, rooted at member 0 (the tree's other primitives, in tree.cpp, use the same
// layout): member v's subtree is [v, v + lowbit(v)) (the root's: everything); its parent is v - lowbit(v).

// Member 0's buffer is cut into pieces; member v ends with its piece (and its subtree's) in place.
void binomial_scatter(Links& l, const Pieces& piece, int m, int v, const RankOf& rank, int tag);

// --- one-shot wrappers -----------------------------------------------------------------------------------------

// Default options with `tag`: what the one-shot wrappers (ring_all_reduce, ...) build their object with.
AlgorithmOptions with_tag(int tag);

}  // namespace crosstrain::comm::algo::detail
