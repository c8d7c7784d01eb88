// The ring (RingAlgorithm): bandwidth-optimal, every rank sends 2(n-1)/n of the buffer in an all-reduce, in
// 2(n-1) steps. The all-reduce is a reduce-scatter then an all-gather around the ring, pipelined in pieces of
// options.piece_bytes; reduce-scatter and all-gather are n-1 steps of 1/n of the buffer; the broadcast is a
// pipelined chain from the root in ring_broadcast_segments() pieces. Also the one-shot ring_* wrappers.
#include "crosstrain/comm/algorithms/ring.h"

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

// Pieces per ring chunk of `chunk_bytes`: at most `piece_bytes` each (0: one piece), at most 16 and at most one
// per element.
int ring_pieces(int64_t chunk_bytes, int64_t piece_bytes, int64_t chunk_numel) {
  if (piece_bytes <= 0 || chunk_numel <= 1) return 1;
  const int64_t k = (chunk_bytes + piece_bytes - 1) / piece_bytes;
  return static_cast<int>(std::clamp<int64_t>(k, 1, std::min<int64_t>(16, chunk_numel)));
}

}  // namespace

int ring_broadcast_segments(int64_t bytes, int n, int most) {
  if (n <= 2 || most <= 1) return 1;
  return static_cast<int>(std::clamp<int64_t>(bytes / kMinBroadcastSegment, 1, most));
}

RingAlgorithm::RingAlgorithm(Communicator& comm, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Ring, comm, options) {
  if (options.reserve_numel > 0) reserve(options.reserve_numel, options.reserve_dtype);
}

int64_t RingAlgorithm::scratch_need(int64_t numel, int64_t elem) const {
  const int64_t chunk = (numel + comm_.size() - 1) / comm_.size() * elem;
  return Scratch::bytes_for({chunk, chunk});
}

void RingAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat("ring all-reduce", t);
  const int n = comm_.size(), r = comm_.rank();
  if (n == 1 || t.numel() == 0) return finish_avg(t, op, n);
  scratch_.reset();
  Links l(comm_, timeout());
  at::Tensor flat = t.view({-1});
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  const int64_t chunk_numel = segment(flat.numel(), n, 0).second;  // the largest chunk
  const int pieces = ring_pieces(chunk_numel * t.element_size(), options_.piece_bytes, chunk_numel);
  // Piece j of chunk i, as a range within the chunk (chunks and pieces cut as evenly as the elements allow).
  auto chunk_at = [&](int i) { return segment(flat.numel(), n, ((i % n) + n) % n); };
  auto piece = [&](int i, int j) {
    auto [b, e] = chunk_at(i);
    auto [pb, pe] = segment(e - b, pieces, j);
    return flat.slice(0, b + pb, b + pe);
  };
  at::Tensor scratch = scratch_.take(chunk_numel, t.scalar_type());
  // Where piece j of chunk i lands before it is combined: at piece j's place in the largest chunk, so that it never
  // overlaps another piece still in flight (a smaller chunk's pieces are no longer).
  auto scratch_piece = [&](int i, int j) {
    auto [b, e] = chunk_at(i);
    auto [pb, pe] = segment(e - b, pieces, j);
    const int64_t at = segment(chunk_numel, pieces, j).first;
    return scratch.slice(0, at, at + (pe - pb));
  };
  // Reduce-scatter: at step s rank r sends chunk r-s and receives chunk r-s-1, adds it to its own and sends that
  // chunk on at step s+1. After n-1 steps rank r holds the reduced chunk r+1. Messages between two ranks on one
  // tag arrive in the order sent, so every piece of every step can be in flight at once.
  std::vector<WorkPtr> sends, recvs(pieces);
  for (int j = 0; j < pieces; ++j) {
    sends.push_back(l.post_send(piece(r, j), right, tag()));
    recvs[j] = l.post_recv(scratch_piece(r - 1, j), left, tag());
  }
  for (int s = 0; s < n - 1; ++s) {
    for (int j = 0; j < pieces; ++j) {
      l.wait(recvs[j]);
      at::Tensor target = piece(r - s - 1, j);
      combine(target, scratch_piece(r - s - 1, j), op);
      if (s + 1 < n - 1) {
        sends.push_back(l.post_send(target, right, tag()));
        recvs[j] = l.post_recv(scratch_piece(r - s - 2, j), left, tag());
      }
    }
  }
  // The all-gather receives into chunks sent above: those sends must be done.
  l.wait_all(sends);
  sends.clear();
  // All-gather: at step s rank r sends chunk r+1-s and receives chunk r-s in place, which it forwards at step s+1.
  for (int j = 0; j < pieces; ++j) {
    sends.push_back(l.post_send(piece(r + 1, j), right, tag() + 1));
    recvs[j] = l.post_recv(piece(r, j), left, tag() + 1);
  }
  for (int s = 0; s < n - 1; ++s) {
    for (int j = 0; j < pieces; ++j) {
      l.wait(recvs[j]);
      if (s + 1 < n - 1) {
        sends.push_back(l.post_send(piece(r - s, j), right, tag() + 1));
        recvs[j] = l.post_recv(piece(r - s - 1, j), left, tag() + 1);
      }
    }
  }
  l.wait_all(sends);
  finish_avg(t, op, n);
}

void RingAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("ring reduce-scatter", out, in, n);
  const int64_t per = out.numel();
  at::Tensor src = in.view({-1}), dst = out.view({-1});
  auto row = [&](int i) {
    i = ((i % n) + n) % n;
    return src.slice(0, i * per, (i + 1) * per);
  };
  if (n == 1) {
    dst.copy_(src);
    return finish_avg(out, op, n);
  }
  if (per == 0) return;
  scratch_.reset();
  Links l(comm_, timeout());
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  at::Tensor received = scratch_.take(per, in.scalar_type()), partial = scratch_.take(per, in.scalar_type());
  // Step s sends the partial sum of slice r-s-1 and receives that of slice r-s-2: rank r ends with slice r.
  // The input is never written: partial sums live in scratch.
  for (int s = 0; s < n - 1; ++s) {
    l.exchange(s == 0 ? row(r - 1) : partial, right, received, left, tag());
    at::Tensor target = s == n - 2 ? dst : partial;
    combine_out(target, row(r - s - 2), received, op);
  }
  finish_avg(out, op, n);
}

void RingAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("ring all-gather", in, out, n);
  const int64_t per = in.numel();
  at::Tensor flat = out.view({-1});
  auto row = [&](int i) {
    i = ((i % n) + n) % n;
    return flat.slice(0, i * per, (i + 1) * per);
  };
  row(r).copy_(in.view({-1}));
  if (n == 1 || per == 0) return;
  Links l(comm_, timeout());
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) l.exchange(row(r - s), right, row(r - s - 1), left, tag());
}

void RingAlgorithm::broadcast(at::Tensor& t, int root) {
  check_flat("ring broadcast", t);
  const int n = comm_.size(), r = comm_.rank();
  if (root < 0 || root >= n) throw UsageError("ring broadcast: root " + std::to_string(root) + " is not a rank");
  if (n == 1 || t.numel() == 0) return;
  Links l(comm_, timeout());
  const int vr = (r - root + n) % n;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  at::Tensor flat = t.view({-1});
  const int segments = static_cast<int>(std::min<int64_t>(
      ring_broadcast_segments(flat.numel() * t.element_size(), n, options_.segments), flat.numel()));
  std::vector<WorkPtr> sends;
  for (int i = 0; i < segments; ++i) {
    auto [b, e] = segment(flat.numel(), segments, i);
    at::Tensor piece = flat.slice(0, b, e);
    if (vr > 0) l.recv(piece, prev, tag());
    if (vr < n - 1) sends.push_back(l.post_send(piece, next, tag()));  // forward while receiving the next piece
  }
  l.wait_all(sends);
}

// --- one-shot wrappers -------------------------------------------------------------------------------------------

void ring_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) { RingAlgorithm(c, with_tag(tag)).all_reduce(t, op); }

void ring_reduce_scatter(Communicator& c, const at::Tensor& in, at::Tensor& out, ReduceOp op, int tag) {
  RingAlgorithm(c, with_tag(tag)).reduce_scatter(in, out, op);
}

void ring_all_gather(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag) {
  RingAlgorithm(c, with_tag(tag)).all_gather(in, out);
}

void ring_broadcast(Communicator& c, at::Tensor& t, int root, int segments, int tag) {
  AlgorithmOptions o = with_tag(tag);
  o.segments = std::max(1, segments);
  RingAlgorithm(c, o).broadcast(t, root);
}

}  // namespace crosstrain::comm::algo
