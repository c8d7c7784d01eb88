// Recursive halving-doubling (HalvingDoublingAlgorithm): the ring's bytes (every rank sends 2(n-1)/n of the
// buffer in an all-reduce) in 2 log2 p steps instead of 2(n-1). The all-reduce is Rabenseifner's: a recursive
// halving reduce-scatter, then a recursive doubling all-gather; the broadcast is a binomial scatter then a
// recursive doubling (van de Geijn, ~2x the buffer per rank). Worlds that are not a power of two fold the extra
// ranks in first (Fold: odd ranks below 2(n-p) hand their data to their even neighbour) and out at the end. Also
// the one-shot halving_doubling_all_reduce.
#include "crosstrain/comm/algorithms/halving_doubling.h"

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

// Where each of `parts` segments (segment()) begins, and `numel` last.
std::vector<int64_t> segment_offsets(int64_t numel, int parts) {
  std::vector<int64_t> offs(parts + 1);
  for (int i = 0; i < parts; ++i) offs[i] = segment(numel, parts, i).first;
  offs[parts] = numel;
  return offs;
}

// --- recursive halving and doubling over p = 2^k members ------------------------------------------------------

// Member v ends with piece v reduced over all members. `tmp` holds at least the larger half of the buffer. With
// `source`, the data starts there and is only read: the first step sends from it and writes source op received
// into the kept half of `piece`, so nobody copies the whole input first.
void recursive_halving(Links& l, const Pieces& piece, at::Tensor tmp, int p, int v, const RankOf& rank, ReduceOp op,
                       int tag, const Pieces* source = nullptr) {
  int lo = 0;
  for (int mask = p / 2; mask > 0; mask >>= 1) {
    const int partner = v ^ mask, mid = lo + mask, hi = lo + 2 * mask;
    const bool low = (v & mask) == 0;
    const Pieces& from = source && mask == p / 2 ? *source : piece;
    at::Tensor keep = low ? piece(lo, mid) : piece(mid, hi);
    at::Tensor give = low ? from(mid, hi) : from(lo, mid);
    at::Tensor in = tmp.slice(0, 0, keep.numel());
    l.exchange(give, rank(partner), in, rank(partner), tag);
    combine_out(keep, low ? from(lo, mid) : from(mid, hi), in, op);
    if (!low) lo = mid;
  }
}

// Member v starts with piece v; every member ends with all pieces.
void recursive_doubling(Links& l, const Pieces& piece, int p, int v, const RankOf& rank, int tag) {
  for (int mask = 1; mask < p; mask <<= 1) {
    const int partner = v ^ mask;
    const int mine = v & ~(mask - 1), theirs = partner & ~(mask - 1);
    l.exchange(piece(mine, mine + mask), rank(partner), piece(theirs, theirs + mask), rank(partner), tag);
  }
}

// Worlds that are not a power of two: among the first 2*extra ranks, odd ones hand their data to their even
// neighbour and sit out; p = n - extra members remain (member v is rank first(v)).
struct Fold {
  int p = 1, extra = 0;
  explicit Fold(int n) {
    while (p * 2 <= n) p *= 2;
    extra = n - p;
  }
  bool sits_out(int vr) const { return vr < 2 * extra && vr % 2 == 1; }
  bool hosts_extra(int vr) const { return vr < 2 * extra && vr % 2 == 0; }
  int member(int vr) const { return vr < 2 * extra ? (vr % 2 == 1 ? -1 : vr / 2) : vr - extra; }
  int first(int v) const { return v < extra ? 2 * v : v + extra; }
};

}  // namespace

HalvingDoublingAlgorithm::HalvingDoublingAlgorithm(Communicator& comm, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::HalvingDoubling, comm, options) {
  if (options.reserve_numel > 0) reserve(options.reserve_numel, options.reserve_dtype);
}

int64_t HalvingDoublingAlgorithm::scratch_need(int64_t numel, int64_t elem) const {
  return Scratch::bytes_for({numel * elem, numel * elem});
}

// Tags: tag (fold in), tag + 1 (halving), tag + 2 (doubling and scatter), tag + 3 (fold out).
void HalvingDoublingAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat("halving-doubling all-reduce", t);
  const int n = comm_.size(), r = comm_.rank();
  if (n == 1 || t.numel() == 0) return finish_avg(t, op, n);
  scratch_.reset();
  Links l(comm_, timeout());
  at::Tensor flat = t.view({-1});
  const Fold f(n);
  const int64_t numel = flat.numel();
  auto offs = segment_offsets(numel, f.p);
  const int64_t half = std::max(offs[f.p / 2], numel - offs[f.p / 2]);
  if (f.sits_out(r)) {
    l.send(flat, r - 1, tag());
  } else {
    at::Tensor tmp = scratch_.take(f.hosts_extra(r) ? numel : half, t.scalar_type());
    if (f.hosts_extra(r)) {
      l.recv(tmp, r + 1, tag());
      combine(flat, tmp, op);
    }
    const int v = f.member(r);
    RankOf rank = [&](int m) { return f.first(m); };
    Pieces piece{flat, offs};
    recursive_halving(l, piece, tmp, f.p, v, rank, op, tag() + 1);
    recursive_doubling(l, piece, f.p, v, rank, tag() + 2);
  }
  if (f.sits_out(r)) l.recv(flat, r - 1, tag() + 3);
  else if (f.hosts_extra(r)) l.send(flat, r + 1, tag() + 3);
  finish_avg(t, op, n);
}

void HalvingDoublingAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("halving-doubling reduce-scatter", out, in, n);
  const int64_t per = out.numel(), numel = in.numel();
  at::Tensor src = in.view({-1}), dst = out.view({-1});
  if (n == 1) {
    dst.copy_(src);
    return finish_avg(out, op, n);
  }
  if (per == 0) return;
  scratch_.reset();
  Links l(comm_, timeout());
  const Fold f(n);
  if (f.sits_out(r)) {
    l.send(src, r - 1, tag());
    l.recv(dst, r - 1, tag() + 3);
    return finish_avg(out, op, n);
  }
  at::Tensor work = scratch_.take(numel, in.scalar_type());
  const bool folded = f.hosts_extra(r);  // then `work` holds its own input combined with its neighbour's
  if (folded) {
    l.recv(work, r + 1, tag());
    combine(work, src, op);
  }
  // Members own the slices of the ranks they stand for: member v < extra two (its own and its odd neighbour's).
  std::vector<int64_t> offs(f.p + 1);
  for (int v = 0; v < f.p; ++v) offs[v] = per * f.first(v);
  offs[f.p] = numel;
  const int64_t half = std::max(offs[f.p / 2], numel - offs[f.p / 2]);
  Pieces piece{work, offs}, input{src, offs};
  recursive_halving(l, piece, scratch_.take(half, in.scalar_type()), f.p, f.member(r), [&](int m) { return f.first(m); },
                    op, tag() + 1, folded ? nullptr : &input);
  if (f.hosts_extra(r)) l.send(work.slice(0, (r + 1) * per, (r + 2) * per), r + 1, tag() + 3);
  dst.copy_(work.slice(0, r * per, (r + 1) * per));
  finish_avg(out, op, n);
}

void HalvingDoublingAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const int n = comm_.size(), r = comm_.rank();
  check_sliced("halving-doubling all-gather", in, out, n);
  const int64_t per = in.numel();
  at::Tensor src = in.view({-1}), flat = out.view({-1});
  flat.slice(0, r * per, (r + 1) * per).copy_(src);
  if (n == 1 || per == 0) return;
  Links l(comm_, timeout());
  const Fold f(n);
  if (f.sits_out(r)) {
    l.send(src, r - 1, tag());
    l.recv(flat, r - 1, tag() + 3);
    return;
  }
  if (f.hosts_extra(r)) l.recv(flat.slice(0, (r + 1) * per, (r + 2) * per), r + 1, tag());
  std::vector<int64_t> offs(f.p + 1);
  for (int v = 0; v < f.p; ++v) offs[v] = per * f.first(v);
  offs[f.p] = flat.numel();
  Pieces piece{flat, offs};
  recursive_doubling(l, piece, f.p, f.member(r), [&](int m) { return f.first(m); }, tag() + 2);
  if (f.hosts_extra(r)) l.send(flat, r + 1, tag() + 3);
}

void HalvingDoublingAlgorithm::broadcast(at::Tensor& t, int root) {
  check_flat("halving-doubling broadcast", t);
  const int n = comm_.size(), r = comm_.rank();
  if (root < 0 || root >= n)
    throw UsageError("halving-doubling broadcast: root " + std::to_string(root) + " is not a rank");
  if (n == 1 || t.numel() == 0) return;
  Links l(comm_, timeout());
  at::Tensor flat = t.view({-1});
  const Fold f(n);
  const int vr = (r - root + n) % n;  // ranks relative to the root; the root is member 0
  auto real = [&](int v) { return (v + root) % n; };
  if (f.sits_out(vr)) return l.recv(flat, real(vr - 1), tag() + 3);
  auto offs = segment_offsets(flat.numel(), f.p);
  Pieces piece{flat, offs};
  RankOf rank = [&](int m) { return real(f.first(m)); };
  const int v = f.member(vr);
  binomial_scatter(l, piece, f.p, v, rank, tag());
  recursive_doubling(l, piece, f.p, v, rank, tag() + 2);
  if (f.hosts_extra(vr)) l.send(flat, real(vr + 1), tag() + 3);
}

// --- one-shot wrapper --------------------------------------------------------------------------------------------

void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) {
  HalvingDoublingAlgorithm(c, with_tag(tag)).all_reduce(t, op);
}

}  // namespace crosstrain::comm::algo
