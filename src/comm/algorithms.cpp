#include "crosstrain/comm/algorithms.h"

#include <ATen/ATen.h>

#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {
namespace {

// acc <- acc op x (elementwise, in place). Avg sums here and divides once at the end.
void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: acc.add_(x); break;
    case ReduceOp::Product: acc.mul_(x); break;
    case ReduceOp::Min: at::minimum_out(acc, acc, x); break;
    case ReduceOp::Max: at::maximum_out(acc, acc, x); break;
  }
}

void finish_avg(at::Tensor& t, ReduceOp op, int n) {
  if (op != ReduceOp::Avg) return;
  if (at::isFloatingType(t.scalar_type())) t.div_(n);
  else t.copy_(at::div(t, n, "trunc"));
}

// Exchange with possibly different peers: send `out` to `to`, receive `in` from `from`, both with `tag`.
void exchange(Communicator& c, const at::Tensor& out, int to, at::Tensor& in, int from, int tag) {
  WorkPtr s = out.numel() > 0 ? c.send(out, to, tag) : nullptr;
  if (in.numel() > 0) c.recv(in, from, tag)->wait();
  if (s) s->wait();
}

// [begin, end) of segment i when `numel` elements are cut into `parts` nearly equal segments.
std::pair<int64_t, int64_t> segment(int64_t numel, int parts, int i) {
  const int64_t base = numel / parts, extra = numel % parts;
  const int64_t begin = i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

void check_flat(const char* what, const at::Tensor& t) {
  if (!t.is_contiguous()) throw UsageError(std::string(what) + ": buffers must be contiguous");
}

}  // namespace

Algorithm parse_algorithm(const std::string& name) {
  if (name == "builtin") return Algorithm::Builtin;
  if (name == "ring") return Algorithm::Ring;
  if (name == "tree") return Algorithm::Tree;
  if (name == "hd" || name == "halving-doubling") return Algorithm::HalvingDoubling;
  if (name == "hierarchical") return Algorithm::Hierarchical;
  throw UsageError("unknown algorithm '" + name + "'; use builtin, ring, tree, hd or hierarchical");
}

const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::Builtin: return "builtin";
    case Algorithm::Ring: return "ring";
    case Algorithm::Tree: return "tree";
    case Algorithm::HalvingDoubling: return "hd";
    case Algorithm::Hierarchical: return "hierarchical";
  }
  return "?";
}

void ring_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) {
  check_flat("ring all-reduce", t);
  const int n = c.size(), r = c.rank();
  if (n == 1 || t.numel() == 0) return finish_avg(t, op, n);
  at::Tensor flat = t.view({-1});
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto chunk = [&](int i) {
    auto [b, e] = segment(flat.numel(), n, ((i % n) + n) % n);
    return flat.slice(0, b, e);
  };
  // Reduce-scatter: after n-1 steps rank r holds the reduced chunk r+1.
  at::Tensor scratch = at::empty({chunk(0).numel()}, t.options());
  for (int s = 0; s < n - 1; ++s) {
    at::Tensor send = chunk(r - s), target = chunk(r - s - 1);
    at::Tensor in = scratch.slice(0, 0, target.numel());
    exchange(c, send.contiguous(), right, in, left, tag + s);
    combine(target, in, op);
  }
  // All-gather the reduced chunks around the ring.
  for (int s = 0; s < n - 1; ++s) {
    at::Tensor send = chunk(r + 1 - s), target = chunk(r - s);
    at::Tensor in = scratch.slice(0, 0, target.numel());
    exchange(c, send.contiguous(), right, in, left, tag + n + s);
    target.copy_(in);
  }
  finish_avg(t, op, n);
}

void ring_reduce_scatter(Communicator& c, const at::Tensor& in, at::Tensor& out, ReduceOp op, int tag) {
  check_flat("ring reduce-scatter", in);
  const int n = c.size(), r = c.rank();
  if (in.numel() != out.numel() * n) throw UsageError("ring reduce-scatter: input must hold size() x output elements");
  at::Tensor work = in.reshape({n, -1}).clone();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  at::Tensor scratch = at::empty({out.numel()}, in.options());
  // Start one chunk ahead so that rank r ends with its own chunk r.
  for (int s = 0; s < n - 1; ++s) {
    const int send = ((r - s - 1) % n + n) % n, recv = ((r - s - 2) % n + n) % n;
    exchange(c, work[send], right, scratch, left, tag + s);
    at::Tensor target = work[recv];
    combine(target, scratch, op);
  }
  out.view({-1}).copy_(work[r]);
  finish_avg(out, op, n);
}

void ring_all_gather(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag) {
  const int n = c.size(), r = c.rank();
  if (out.numel() != in.numel() * n) throw UsageError("ring all-gather: output must hold size() x input elements");
  at::Tensor rows = out.view({n, -1});
  rows[r].copy_(in.reshape({-1}));
  if (in.numel() == 0) return;
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    const int send = ((r - s) % n + n) % n, recv = ((r - s - 1) % n + n) % n;
    at::Tensor target = rows[recv];
    exchange(c, rows[send], right, target, left, tag + s);
  }
}

void ring_broadcast(Communicator& c, at::Tensor& t, int root, int segments, int tag) {
  check_flat("ring broadcast", t);
  const int n = c.size(), r = c.rank();
  if (n == 1 || t.numel() == 0) return;
  const int vr = (r - root + n) % n;
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  at::Tensor flat = t.view({-1});
  segments = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(segments, flat.numel())));
  std::vector<WorkPtr> sends;
  for (int i = 0; i < segments; ++i) {
    auto [b, e] = segment(flat.numel(), segments, i);
    at::Tensor piece = flat.slice(0, b, e);
    if (vr > 0) c.recv(piece, prev, tag + i)->wait();
    if (vr < n - 1) sends.push_back(c.send(piece, next, tag + i));  // forward while receiving the next piece
  }
  wait_all(sends);
}

void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag) {
  const int n = c.size(), r = c.rank();
  if (n == 1 || t.numel() == 0) return;
  const int vr = (r - root + n) % n;
  int top = 1;
  while (top < n) top <<= 1;
  // Binomial tree: at step m a rank whose relative index is a multiple of 2m passes the data m further.
  for (int m = top / 2; m > 0; m >>= 1) {
    if ((vr & (2 * m - 1)) == 0 && vr + m < n) c.send(t, (vr + m + root) % n, tag)->wait();
    else if ((vr & (2 * m - 1)) == m) c.recv(t, (vr - m + root) % n, tag)->wait();
  }
}

void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag) {
  const int n = c.size(), r = c.rank();
  if (n == 1 || t.numel() == 0) return;
  const int vr = (r - root + n) % n;
  at::Tensor scratch = at::empty_like(t);
  for (int m = 1; m < n; m <<= 1) {
    if ((vr & (2 * m - 1)) == m) {
      c.send(t, (vr - m + root) % n, tag)->wait();
      return;
    }
    if ((vr & (2 * m - 1)) == 0 && vr + m < n) {
      c.recv(scratch, (vr + m + root) % n, tag)->wait();
      combine(t, scratch, op);
    }
  }
}

void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) {
  check_flat("tree all-reduce", t);
  tree_reduce(c, t, 0, op, tag);
  tree_broadcast(c, t, 0, tag + 1);
  finish_avg(t, op, c.size());
}

void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) {
  check_flat("halving-doubling all-reduce", t);
  const int n = c.size(), r = c.rank();
  if (n == 1 || t.numel() == 0) return finish_avg(t, op, n);
  at::Tensor flat = t.view({-1});
  int p = 1;
  while (p * 2 <= n) p *= 2;
  const int extra = n - p;
  // Fold: among the first 2*extra ranks, odd ones hand their data to their even neighbour and sit out.
  int vr;  // rank among the p participants, -1 when sitting out
  if (r < 2 * extra) {
    if (r % 2 == 1) {
      c.send(flat, r - 1, tag)->wait();
      vr = -1;
    } else {
      at::Tensor in = at::empty_like(flat);
      c.recv(in, r + 1, tag)->wait();
      combine(flat, in, op);
      vr = r / 2;
    }
  } else {
    vr = r - extra;
  }
  auto real = [&](int v) { return v < extra ? 2 * v : v + extra; };
  if (vr >= 0) {
    // Recursive halving: keep half of the current range, send the other half to the partner.
    std::vector<std::pair<int64_t, int64_t>> ranges;
    int64_t lo = 0, hi = flat.numel();
    int step = 1;
    for (int mask = p / 2; mask > 0; mask >>= 1, ++step) {
      const int partner = real(vr ^ mask);
      const int64_t mid = lo + (hi - lo) / 2;
      const bool keep_low = (vr & mask) == 0;
      at::Tensor send = keep_low ? flat.slice(0, mid, hi) : flat.slice(0, lo, mid);
      at::Tensor keep = keep_low ? flat.slice(0, lo, mid) : flat.slice(0, mid, hi);
      at::Tensor in = at::empty({keep.numel()}, flat.options());
      exchange(c, send.contiguous(), partner, in, partner, tag + step);
      combine(keep, in, op);
      ranges.emplace_back(lo, hi);
      if (keep_low) hi = mid;
      else lo = mid;
    }
    // Recursive doubling: swap the reduced halves back, in reverse.
    for (int mask = 1; mask < p; mask <<= 1, ++step) {
      const int partner = real(vr ^ mask);
      auto [plo, phi] = ranges.back();
      ranges.pop_back();
      const int64_t mid = plo + (phi - plo) / 2;
      const bool have_low = (vr & mask) == 0;
      at::Tensor mine = have_low ? flat.slice(0, plo, mid) : flat.slice(0, mid, phi);
      at::Tensor theirs = have_low ? flat.slice(0, mid, phi) : flat.slice(0, plo, mid);
      at::Tensor in = at::empty({theirs.numel()}, flat.options());
      exchange(c, mine.contiguous(), partner, in, partner, tag + step);
      theirs.copy_(in);
    }
  }
  // Unfold: the even neighbours return the result to the ranks that sat out.
  const int last = tag + 2 * 32;
  if (r < 2 * extra) {
    if (r % 2 == 1) c.recv(flat, r - 1, last)->wait();
    else c.send(flat, r + 1, last)->wait();
  }
  finish_avg(t, op, n);
}

void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag) {
  const int n = c.size(), r = c.rank();
  if (in.numel() != out.numel() || in.numel() % n != 0)
    throw UsageError("pairwise all-to-all: input and output must hold size() equal slices");
  at::Tensor src = in.reshape({n, -1}), dst = out.view({n, -1});
  dst[r].copy_(src[r]);
  if (in.numel() == 0) return;
  // Step s: send to r+s, receive from r-s; every pair meets exactly once.
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    at::Tensor target = dst[from];
    exchange(c, src[to].contiguous(), to, target, from, tag + s);
  }
}

Hierarchy make_hierarchy(Communicator& world, int group_size) {
  const int n = world.size();
  if (group_size < 1 || n % group_size != 0)
    throw UsageError("hierarchical: " + std::to_string(n) + " ranks do not split into groups of " +
                     std::to_string(group_size));
  Hierarchy h;
  if (group_size > 1) {
    for (int g = 0; g < n / group_size; ++g) {
      std::vector<int> ranks;
      for (int i = 0; i < group_size; ++i) ranks.push_back(g * group_size + i);
      auto sub = world.split(ranks);
      if (sub) h.local = std::move(sub);
    }
  }
  std::vector<int> leaders;
  for (int g = 0; g < n / group_size; ++g) leaders.push_back(g * group_size);
  h.leaders = world.split(leaders);
  return h;
}

void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag) {
  check_flat("hierarchical all-reduce", t);
  const ReduceOp inner = op == ReduceOp::Avg ? ReduceOp::Sum : op;
  if (h.local) tree_reduce(*h.local, t, 0, inner, tag);
  if (h.leaders) ring_all_reduce(*h.leaders, t, inner, tag + 1);
  if (h.local) tree_broadcast(*h.local, t, 0, tag + 1 + 2 * world.size());
  finish_avg(t, op, world.size());
}

}  // namespace crosstrain::comm::algo
