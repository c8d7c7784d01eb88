// The binomial tree (TreeAlgorithm): latency-optimal, ceil(log2 n) steps each way, the whole buffer per step.
// All-reduce is a binomial reduce to rank 0 then a binomial broadcast; reduce-scatter a reduce then a binomial
// scatter; all-gather a binomial gather then a broadcast; plus the rooted reduce, gather and scatter, and the
// one-shot tree_* wrappers. The binomial primitives only the tree uses are here; the scatter, which
// halving-doubling uses too, is in algorithm_util.
#include "crosstrain/comm/algorithms/tree.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithm_util.h"
#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {

using namespace detail;

namespace {

std::vector<int64_t> slice_offsets(int64_t per, int parts) {
  std::vector<int64_t> offs(parts + 1);
  for (int i = 0; i <= parts; ++i) offs[i] = per * i;
  return offs;
}

// --- binomial trees over members 0..m-1, rooted at member 0 --------------------------------------------------
// Member v's subtree is [v, v + lowbit(v)) (the root's: everything); its parent is v - lowbit(v). The scatter
// (binomial_scatter, algorithm_util.h) uses the same layout.

void binomial_broadcast(Links& l, at::Tensor buf, int m, int v, const RankOf& rank, int tag) {
  if (m == 1 || buf.numel() == 0) return;
  std::vector<WorkPtr> sends;
  for (int k = ceil_pow2(m) / 2; k > 0; k >>= 1) {
    if ((v & (2 * k - 1)) == 0) {
      if (v + k < m) sends.push_back(l.post_send(buf, rank(v + k), tag));
    } else if ((v & (2 * k - 1)) == k) {
      l.recv(buf, rank(v - k), tag);
    }
  }
  l.wait_all(sends);
}

// Reduces into `buf` on member 0; `tmp` receives (same numel). With `src` defined, the data starts in `src`,
// which is only read: the first combine writes src op received into `buf` (a leaf sends `src` itself), so no
// member copies its input first. Returns whether `buf` holds this member's partial result (else `src` does).
bool binomial_reduce(Links& l, at::Tensor buf, at::Tensor tmp, int m, int v, const RankOf& rank, ReduceOp op,
                     int tag, const at::Tensor& src = {}) {
  bool in_buf = !src.defined();
  if (m == 1 || buf.numel() == 0) return in_buf;
  for (int k = 1; k < m; k <<= 1) {
    if (v & k) {
      l.send(in_buf ? buf : src, rank(v - k), tag);
      return in_buf;
    }
    if (v + k < m) {
      l.recv(tmp, rank(v + k), tag);
      if (in_buf) {
        combine(buf, tmp, op);
      } else {
        combine_out(buf, src, tmp, op);
        in_buf = true;
      }
    }
  }
  return in_buf;
}

// Gathers every member's piece into `buf` on member 0 (member v starts with its own piece in place).
void binomial_gather(Links& l, const Pieces& piece, int m, int v, const RankOf& rank, int tag) {
  for (int k = 1; k < m; k <<= 1) {
    if (v & k) {
      l.send(piece(v, std::min(v + k, m)), rank(v - k), tag);
      return;
    }
    if (v + k < m) l.recv(piece(v + k, std::min(v + 2 * k, m)), rank(v + k), tag);
  }
}

}  // namespace

TreeAlgorithm::TreeAlgorithm(Communicator& comm, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Tree, comm, options) {
  if (options.reserve_numel > 0) reserve(options.reserve_numel, options.reserve_dtype);
}

int64_t TreeAlgorithm::scratch_need(int64_t numel, int64_t elem) const {
  return Scratch::bytes_for({numel * elem, numel * elem});
}

void TreeAlgorithm::broadcast(at::Tensor& t, int root) {
  check_flat("tree broadcast", t);
  const int n = comm_.size();
  if (root < 0 || root >= n) throw UsageError("tree broadcast: root " + std::to_string(root) + " is not a rank");
  Links l(comm_, timeout());
  const int vr = (comm_.rank() - root + n) % n;
  binomial_broadcast(l, t.view({-1}), n, vr, [&](int v) { return (v + root) % n; }, tag());
}

void TreeAlgorithm::reduce(at::Tensor& t, int root, ReduceOp op) {
  check_flat("tree reduce", t);
  const int n = comm_.size(), r = comm_.rank();
  if (root < 0 || root >= n) throw UsageError("tree reduce: root " + std::to_string(root) + " is not a rank");
  if (n > 1 && t.numel() > 0) {
    scratch_.reset();
    Links l(comm_, timeout());
    at::Tensor tmp = scratch_.take(t.numel(), t.scalar_type());
    binomial_reduce(l, t.view({-1}), tmp, n, (r - root + n) % n, [&](int v) { return (v + root) % n; }, op, tag());
  }
  if (r == root) finish_avg(t, op, n);
}

void TreeAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat("tree all-reduce", t);
  const int n = comm_.size(), r = comm_.rank();
  if (n == 1 || t.numel() == 0) return finish_avg(t, op, n);
  scratch_.reset();
  Links l(comm_, timeout());
  at::Tensor flat = t.view({-1});
  auto self = [](int v) { return v; };
  binomial_reduce(l, flat, scratch_.take(flat.numel(), t.scalar_type()), n, r, self, op, tag());
  binomial_broadcast(l, flat, n, r, self, tag() + 1);
  finish_avg(t, op, n);
}

void TreeAlgorithm::gather(const at::Tensor& in, at::Tensor& out, int root) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("tree gather", in, out, n);
  if (root < 0 || root >= n) throw UsageError("tree gather: root " + std::to_string(root) + " is not a rank");
  const int64_t per = in.numel();
  const int vr = (r - root + n) % n;
  scratch_.reset();
  // Subtrees are contiguous in member order: gather in that order (in `out` itself when root is 0).
  at::Tensor buf = root == 0 ? out.view({-1}) : scratch_.take(out.numel(), out.scalar_type());
  auto offs = slice_offsets(per, n);
  Pieces piece{buf, offs};
  piece(vr, vr + 1).copy_(in.view({-1}));
  if (n == 1 || per == 0) return;
  Links l(comm_, timeout());
  binomial_gather(l, piece, n, vr, [&](int v) { return (v + root) % n; }, tag());
  if (root != 0 && r == root) {
    at::Tensor dst = out.view({-1});
    const int64_t head = (n - root) * per;  // members 0.. are ranks root..n-1, then 0..root-1
    dst.slice(0, root * per).copy_(buf.slice(0, 0, head));
    dst.slice(0, 0, root * per).copy_(buf.slice(0, head));
  }
}

void TreeAlgorithm::scatter(const at::Tensor& in, at::Tensor& out, int root) {
  const int n = comm_.size(), r = comm_.rank();
  if (root < 0 || root >= n) throw UsageError("tree scatter: root " + std::to_string(root) + " is not a rank");
  check_flat("tree scatter", out);
  if (r == root) check_sliced("tree scatter", out, in, n);
  const int64_t per = out.numel();
  const int vr = (r - root + n) % n;
  if (n == 1) {
    out.view({-1}).copy_(in.view({-1}));
    return;
  }
  if (per == 0) return;
  scratch_.reset();
  at::Tensor buf;
  if (r == root && root == 0) {
    buf = in.view({-1});  // only read
  } else {
    buf = scratch_.take(per * n, out.scalar_type());
    if (r == root) {
      at::Tensor src = in.view({-1});
      const int64_t head = (n - root) * per;
      buf.slice(0, 0, head).copy_(src.slice(0, root * per));
      buf.slice(0, head).copy_(src.slice(0, 0, root * per));
    }
  }
  auto offs = slice_offsets(per, n);
  Pieces piece{buf, offs};
  Links l(comm_, timeout());
  binomial_scatter(l, piece, n, vr, [&](int v) { return (v + root) % n; }, tag());
  out.view({-1}).copy_(piece(vr, vr + 1));
}

void TreeAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("tree reduce-scatter", out, in, n);
  const int64_t per = out.numel();
  if (n == 1) {
    out.view({-1}).copy_(in.view({-1}));
    return finish_avg(out, op, n);
  }
  if (per == 0) return;
  scratch_.reset();
  Links l(comm_, timeout());
  auto self = [](int v) { return v; };
  at::Tensor work = scratch_.take(in.numel(), in.scalar_type());
  binomial_reduce(l, work, scratch_.take(in.numel(), in.scalar_type()), n, r, self, op, tag(), in.view({-1}));
  auto offs = slice_offsets(per, n);
  Pieces piece{work, offs};
  binomial_scatter(l, piece, n, r, self, tag() + 1);
  out.view({-1}).copy_(piece(r, r + 1));
  finish_avg(out, op, n);
}

void TreeAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("tree all-gather", in, out, n);
  const int64_t per = in.numel();
  at::Tensor flat = out.view({-1});
  auto offs = slice_offsets(per, n);
  Pieces piece{flat, offs};
  piece(r, r + 1).copy_(in.view({-1}));
  if (n == 1 || per == 0) return;
  Links l(comm_, timeout());
  auto self = [](int v) { return v; };
  binomial_gather(l, piece, n, r, self, tag());
  binomial_broadcast(l, flat, n, r, self, tag() + 1);
}

// --- one-shot wrappers -------------------------------------------------------------------------------------------

void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag) { TreeAlgorithm(c, with_tag(tag)).broadcast(t, root); }

void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag) {
  TreeAlgorithm(c, with_tag(tag)).reduce(t, root, op);
}

void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) { TreeAlgorithm(c, with_tag(tag)).all_reduce(t, op); }

}  // namespace crosstrain::comm::algo
