#include "crosstrain/comm/algorithms/collectives.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {
namespace {

constexpr int64_t kAlign = 64;

int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

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

// out <- a op b (out may alias a or b).
void combine_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: at::add_out(out, a, b); break;
    case ReduceOp::Product: at::mul_out(out, a, b); break;
    case ReduceOp::Min: at::minimum_out(out, a, b); break;
    case ReduceOp::Max: at::maximum_out(out, a, b); break;
  }
}

void finish_avg(at::Tensor& t, ReduceOp op, int n) {
  if (op != ReduceOp::Avg || t.numel() == 0) return;
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) t.div_(n);
  else t.copy_(at::div(t, n, "trunc"));
}

ReduceOp without_avg(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

// [begin, end) of segment i when `numel` elements are cut into `parts` nearly equal segments.
std::pair<int64_t, int64_t> segment(int64_t numel, int parts, int i) {
  const int64_t base = numel / parts, extra = numel % parts;
  const int64_t begin = i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

std::vector<int64_t> segment_offsets(int64_t numel, int parts) {
  std::vector<int64_t> offs(parts + 1);
  for (int i = 0; i < parts; ++i) offs[i] = segment(numel, parts, i).first;
  offs[parts] = numel;
  return offs;
}

std::vector<int64_t> slice_offsets(int64_t per, int parts) {
  std::vector<int64_t> offs(parts + 1);
  for (int i = 0; i <= parts; ++i) offs[i] = per * i;
  return offs;
}

// Pieces per ring chunk of `chunk_bytes`: at most `piece_bytes` each (0: one piece), at most 16 and at most one
// per element.
int ring_pieces(int64_t chunk_bytes, int64_t piece_bytes, int64_t chunk_numel) {
  if (piece_bytes <= 0 || chunk_numel <= 1) return 1;
  const int64_t k = (chunk_bytes + piece_bytes - 1) / piece_bytes;
  return static_cast<int>(std::clamp<int64_t>(k, 1, std::min<int64_t>(16, chunk_numel)));
}

int ceil_pow2(int n) {
  int top = 1;
  while (top < n) top <<= 1;
  return top;
}

void check_flat(const char* what, const at::Tensor& t) {
  if (!t.defined() || !t.is_contiguous()) throw UsageError(std::string(what) + ": buffers must be contiguous tensors");
}

void check_sliced(const char* what, const at::Tensor& one, const at::Tensor& many, int n) {
  check_flat(what, one);
  check_flat(what, many);
  if (many.numel() != one.numel() * n)
    throw UsageError(std::string(what) + ": the sliced buffer must hold size() (" + std::to_string(n) + ") x " +
                     std::to_string(one.numel()) + " elements, not " + std::to_string(many.numel()));
  if (one.scalar_type() != many.scalar_type())
    throw UsageError(std::string(what) + ": input and output must have the same dtype");
}

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

// --- binomial trees over members 0..m-1, rooted at member 0 --------------------------------------------------
// Member v's subtree is [v, v + lowbit(v)) (the root's: everything); its parent is v - lowbit(v).

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

// Member 0's buffer is cut into pieces; member v ends with its piece (and its subtree's) in place.
void binomial_scatter(Links& l, const Pieces& piece, int m, int v, const RankOf& rank, int tag) {
  std::vector<WorkPtr> sends;
  for (int k = ceil_pow2(m) / 2; k > 0; k >>= 1) {
    if ((v & (2 * k - 1)) == 0) {
      if (v + k < m) sends.push_back(l.post_send(piece(v + k, std::min(v + 2 * k, m)), rank(v + k), tag));
    } else if ((v & (2 * k - 1)) == k) {
      l.recv(piece(v, std::min(v + k, m)), rank(v - k), tag);
    }
  }
  l.wait_all(sends);
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

// --- names -----------------------------------------------------------------------------------------------------

int ring_broadcast_segments(int64_t bytes, int n, int most) {
  if (n <= 2 || most <= 1) return 1;
  return static_cast<int>(std::clamp<int64_t>(bytes / kMinBroadcastSegment, 1, most));
}

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

// --- scratch ---------------------------------------------------------------------------------------------------

void Scratch::reserve(int64_t bytes) {
  if (bytes <= capacity()) return;
  arena_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  ++allocations_;
}

int64_t Scratch::capacity() const { return arena_.defined() ? arena_.numel() : 0; }

int64_t Scratch::bytes_for(std::initializer_list<int64_t> piece_bytes) {
  int64_t total = 0;
  for (int64_t b : piece_bytes) total += round_up(b);
  return total;
}

at::Tensor Scratch::take(int64_t numel, at::ScalarType dtype) {
  auto options = at::TensorOptions().dtype(dtype);
  if (numel == 0) return at::empty({0}, options);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t begin = round_up(used_);
  // Pieces taken before keep the old arena alive; the new one is sized for the whole layout so the next call
  // with the same sizes fits.
  if (begin + bytes > capacity()) {
    arena_ = at::empty({begin + bytes}, at::TensorOptions().dtype(at::kByte));
    ++allocations_;
  }
  used_ = begin + bytes;
  at::Tensor arena = arena_;
  return at::from_blob(static_cast<uint8_t*>(arena_.data_ptr()) + begin, {numel}, [arena](void*) {}, options);
}

// --- the base object -------------------------------------------------------------------------------------------

CollectiveAlgorithm::CollectiveAlgorithm(Algorithm kind, Communicator& comm, const AlgorithmOptions& options)
    : comm_(comm),
      options_(options),
      kind_(kind),
      tag_(options.tag),
      timeout_(options.timeout.count() > 0 ? options.timeout : comm.timeout()) {
  if (options.tag < 0) throw UsageError(std::string(to_string(kind)) + ": tags must be non-negative");
  if (options.segments < 1) throw UsageError(std::string(to_string(kind)) + ": segments must be at least 1");
}

void CollectiveAlgorithm::reserve(int64_t numel, at::ScalarType dtype) {
  scratch_.reserve(scratch_need(numel, static_cast<int64_t>(c10::elementSize(dtype))));
}

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

// --- builtin ---------------------------------------------------------------------------------------------------

BuiltinAlgorithm::BuiltinAlgorithm(Communicator& comm, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Builtin, comm, options) {}

void BuiltinAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) { comm_.all_reduce(t, op)->wait(timeout()); }

void BuiltinAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  comm_.reduce_scatter(in, out, op)->wait(timeout());
}

void BuiltinAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) { comm_.all_gather(in, out)->wait(timeout()); }

void BuiltinAlgorithm::broadcast(at::Tensor& t, int root) { comm_.broadcast(t, root)->wait(timeout()); }

void BuiltinAlgorithm::all_to_all(const at::Tensor& in, at::Tensor& out) { comm_.all_to_all(in, out)->wait(timeout()); }

// --- ring ------------------------------------------------------------------------------------------------------

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

// --- binomial tree -----------------------------------------------------------------------------------------------

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

// --- recursive halving-doubling ----------------------------------------------------------------------------------

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

// --- hierarchical ------------------------------------------------------------------------------------------------

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

HierarchicalAlgorithm::HierarchicalAlgorithm(Communicator& world, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Hierarchical, world, options), h_(&owned_) {
  if (options.group_size < 1)
    throw UsageError("hierarchical: set group_size (ranks per group, e.g. the ranks of one host)");
  owned_ = make_hierarchy(world, options.group_size);
  build();
}

HierarchicalAlgorithm::HierarchicalAlgorithm(Communicator& world, Hierarchy& hierarchy, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Hierarchical, world, options), h_(&hierarchy) {
  build();
}

void HierarchicalAlgorithm::build() {
  if (options_.across == Algorithm::Hierarchical)
    throw UsageError("hierarchical: the algorithm across group leaders must be builtin, ring, tree or hd");
  group_size_ = h_->local ? h_->local->size() : 1;
  if (comm_.size() % group_size_ != 0)
    throw UsageError("hierarchical: the groups do not divide the " + std::to_string(comm_.size()) + " ranks");
  AlgorithmOptions sub = options_;
  sub.reserve_numel = 0;
  if (h_->local) inside_ = std::make_unique<TreeAlgorithm>(*h_->local, sub);
  if (h_->leaders) across_ = make_algorithm(options_.across, *h_->leaders, sub);
  if (options_.reserve_numel > 0) reserve(options_.reserve_numel, options_.reserve_dtype);
}

int64_t HierarchicalAlgorithm::scratch_need(int64_t numel, int64_t elem) const {
  return Scratch::bytes_for({numel * elem, numel / std::max(1, comm_.size() / group_size_) * elem});
}

void HierarchicalAlgorithm::reserve(int64_t numel, at::ScalarType dtype) {
  CollectiveAlgorithm::reserve(numel, dtype);
  if (inside_) inside_->reserve(numel, dtype);
  if (across_) across_->reserve(numel, dtype);
}

int HierarchicalAlgorithm::allocations() const {
  return scratch_.allocations() + (inside_ ? inside_->allocations() : 0) + (across_ ? across_->allocations() : 0);
}

int64_t HierarchicalAlgorithm::scratch_bytes() const {
  return scratch_.capacity() + (inside_ ? inside_->scratch_bytes() : 0) + (across_ ? across_->scratch_bytes() : 0);
}

void HierarchicalAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat("hierarchical all-reduce", t);
  const ReduceOp inner = without_avg(op);
  if (inside_) inside_->reduce(t, 0, inner);
  if (across_) across_->all_reduce(t, inner);
  if (inside_) inside_->broadcast(t, 0);
  finish_avg(t, op, comm_.size());
}

void HierarchicalAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const int n = comm_.size(), g = group_size_;
  check_sliced("hierarchical reduce-scatter", out, in, n);
  const ReduceOp inner = without_avg(op);
  if (!inside_) {
    across_->reduce_scatter(in, out, inner);
    return finish_avg(out, op, n);
  }
  // Reduce the whole buffer to the group leader, reduce-scatter blocks of g slices across leaders (leader of
  // group G gets the slices of ranks G*g ..), then scatter the block inside the group.
  scratch_.reset();
  at::Tensor work = scratch_.take(in.numel(), in.scalar_type());
  at::Tensor block = scratch_.take(out.numel() * g, in.scalar_type());
  work.copy_(in.view({-1}));
  inside_->reduce(work, 0, inner);
  if (across_) across_->reduce_scatter(work, block, inner);
  inside_->scatter(block, out, 0);
  finish_avg(out, op, n);
}

void HierarchicalAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const int n = comm_.size(), g = group_size_;
  check_sliced("hierarchical all-gather", in, out, n);
  if (!inside_) return across_->all_gather(in, out);
  scratch_.reset();
  at::Tensor block = scratch_.take(in.numel() * g, in.scalar_type());
  inside_->gather(in, block, 0);
  if (across_) across_->all_gather(block, out);
  inside_->broadcast(out, 0);
}

void HierarchicalAlgorithm::broadcast(at::Tensor& t, int root) {
  check_flat("hierarchical broadcast", t);
  const int n = comm_.size(), g = group_size_, r = comm_.rank();
  if (root < 0 || root >= n) throw UsageError("hierarchical broadcast: root " + std::to_string(root) + " is not a rank");
  // The root hands the buffer to its group's leader, the leaders broadcast, every leader broadcasts inside.
  const int leader = root / g * g;
  if (root != leader) {
    Links l(comm_, timeout());
    if (r == root) l.send(t.view({-1}), leader, tag());
    else if (r == leader) l.recv(t.view({-1}), root, tag());
  }
  if (across_) across_->broadcast(t, root / g);
  if (inside_) inside_->broadcast(t, 0);
}

// --- factory and one-shot wrappers -------------------------------------------------------------------------------

std::unique_ptr<CollectiveAlgorithm> make_algorithm(Algorithm a, Communicator& comm, const AlgorithmOptions& options) {
  switch (a) {
    case Algorithm::Builtin: return std::make_unique<BuiltinAlgorithm>(comm, options);
    case Algorithm::Ring: return std::make_unique<RingAlgorithm>(comm, options);
    case Algorithm::Tree: return std::make_unique<TreeAlgorithm>(comm, options);
    case Algorithm::HalvingDoubling: return std::make_unique<HalvingDoublingAlgorithm>(comm, options);
    case Algorithm::Hierarchical: return std::make_unique<HierarchicalAlgorithm>(comm, options);
  }
  throw UsageError("unknown algorithm");
}

namespace {
AlgorithmOptions with_tag(int tag) {
  AlgorithmOptions o;
  o.tag = tag;
  return o;
}
}  // namespace

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

void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag) { TreeAlgorithm(c, with_tag(tag)).broadcast(t, root); }

void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag) {
  TreeAlgorithm(c, with_tag(tag)).reduce(t, root, op);
}

void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) { TreeAlgorithm(c, with_tag(tag)).all_reduce(t, op); }

void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag) {
  HalvingDoublingAlgorithm(c, with_tag(tag)).all_reduce(t, op);
}

void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag) {
  RingAlgorithm(c, with_tag(tag)).all_to_all(in, out);
}

void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag) {
  HierarchicalAlgorithm(world, h, with_tag(tag)).all_reduce(t, op);
}

}  // namespace crosstrain::comm::algo
