// Collective algorithms of our own, on a communicator's point-to-point primitives (send/recv with tags).
//
// Each algorithm is an object (CollectiveAlgorithm) built on one communicator with a tag, a timeout and its own
// scratch buffers: reserve(numel, dtype) allocates them once for buffers up to that size, and every later call
// reuses them (allocations() counts the times they grew). Calls are synchronous, use the tags
// [tag, tag + kTagsPerCall) of the communicator, and wait at most `timeout` for every send and receive. Buffers
// follow the Communicator conventions (flat contiguous tensors; slice i of a sliced buffer belongs to rank i).
// All members must call the same operations in the same order, as with the built-in collectives. An object is
// not thread-safe.
//
//                    all-reduce               reduce-scatter            all-gather               broadcast
//   ring             RS + AG, 2(n-1) steps    n-1 steps of 1/n          n-1 steps of 1/n         pipelined chain
//   tree (binomial)  reduce + broadcast       reduce, binomial scatter  binomial gather + bcast  binomial
//   halving-doubling Rabenseifner             recursive halving         recursive doubling       scatter + doubling
//   hierarchical     in group, leaders, bcast in group, leaders, scatter gather, leaders, bcast  to leader, leaders, bcast
//
//   ring             bandwidth-optimal: every rank sends 2(n-1)/n of the buffer
//   tree             latency-optimal: ceil(log2 n) steps each way, the whole buffer per step
//   halving-doubling 2 log2 n steps and the ring's bytes; worlds that are not a power of two fold the extra ranks
//                    in first (odd ranks below 2(n-p) hand their data to their even neighbour) and out at the end
//   hierarchical     groups of consecutive ranks (a host, a cluster): a binomial tree inside each group and an
//                    algorithm of choice (ring by default) across the group leaders: only leaders use slow links
//   all-to-all       pairwise exchange (n-1 steps) for every algorithm
//
// Every rank ends an all-reduce with the same bits: each element is reduced once, on one rank, and then copied.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

enum class Algorithm { Builtin, Ring, Tree, HalvingDoubling, Hierarchical };
// "builtin", "ring", "tree", "hd" (or "halving-doubling"), "hierarchical"; throws UsageError listing them.
Algorithm parse_algorithm(const std::string& name);
const char* to_string(Algorithm a);

constexpr int kDefaultTag = 1 << 20;
// Tags one call may use, starting at the object's tag. Objects used on the same communicator in the same order
// on every rank may share tags (messages of one pair and tag arrive in order); distinct ranges keep them apart.
constexpr int kTagsPerCall = 8;

// Pieces of the ring broadcast's pipelined chain for a buffer of `bytes` on n ranks: at most `most`, each at least
// kMinBroadcastSegment bytes (a smaller piece costs more in per-message latency than the pipeline saves), and one
// on 2 ranks, where there is no one to forward to. Pure; the cost model counts the same pieces.
constexpr int64_t kMinBroadcastSegment = 64 << 10;
int ring_broadcast_segments(int64_t bytes, int n, int most);

struct AlgorithmOptions {
  int tag = kDefaultTag;
  Millis timeout{0};        // per send and receive; 0: the communicator's timeout
  int segments = 8;         // ring broadcast: most pieces of the pipelined chain (ring_broadcast_segments)
  // Ring all-reduce: each step's chunk travels in pieces of at most this many bytes (at most 16 pieces), so that
  // combining or forwarding one piece overlaps receiving the next; 0: whole chunks.
  int64_t piece_bytes = 1 << 20;
  int group_size = 0;       // hierarchical: ranks per group (consecutive ranks); required for Hierarchical
  Algorithm across = Algorithm::Ring;  // hierarchical: the algorithm among the group leaders
  int64_t reserve_numel = 0;           // when > 0, the constructor calls reserve(reserve_numel, reserve_dtype)
  at::ScalarType reserve_dtype = at::kFloat;
};

// Scratch memory of one algorithm object: one byte arena carved into aligned pieces at each call.
class Scratch {
 public:
  // Makes the arena at least `bytes` long (one allocation when it grows).
  void reserve(int64_t bytes);
  // Starts a call: pieces are carved from the beginning again.
  void reset() { used_ = 0; }
  // The next `numel` elements of `dtype`; grows the arena when they do not fit (pieces taken before stay valid).
  at::Tensor take(int64_t numel, at::ScalarType dtype);
  int64_t capacity() const;
  int allocations() const { return allocations_; }
  // Bytes `take` needs for pieces of these sizes, alignment included.
  static int64_t bytes_for(std::initializer_list<int64_t> piece_bytes);

 private:
  at::Tensor arena_;  // uint8
  int64_t used_ = 0;
  int allocations_ = 0;
};

class CollectiveAlgorithm {
 public:
  virtual ~CollectiveAlgorithm() = default;
  CollectiveAlgorithm(const CollectiveAlgorithm&) = delete;
  CollectiveAlgorithm& operator=(const CollectiveAlgorithm&) = delete;

  Algorithm kind() const { return kind_; }
  const char* name() const { return to_string(kind_); }
  Communicator& comm() const { return comm_; }
  int tag() const { return tag_; }
  Millis timeout() const { return timeout_; }

  // In place; every rank ends with the same result.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // `input` holds size() slices of `output.numel()` elements; rank r gets the reduced slice r.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  // `output` holds size() slices of `input.numel()` elements; slice r is rank r's input.
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  virtual void broadcast(at::Tensor& tensor, int root) = 0;
  // Pairwise: step s sends slice r+s to rank r+s and receives slice r-s from rank r-s.
  virtual void all_to_all(const at::Tensor& input, at::Tensor& output);

  // Allocates scratch for calls on buffers of up to `numel` elements of `dtype` (the all-reduce and broadcast
  // buffer, the reduce-scatter input, the all-gather output), so that such calls allocate nothing.
  virtual void reserve(int64_t numel, at::ScalarType dtype);
  // Times scratch was allocated or grown (this object and the ones it is built on).
  virtual int allocations() const { return scratch_.allocations(); }
  virtual int64_t scratch_bytes() const { return scratch_.capacity(); }

 protected:
  CollectiveAlgorithm(Algorithm kind, Communicator& comm, const AlgorithmOptions& options);
  // Scratch bytes the worst of this object's collectives needs for a buffer of `numel` elements of `elem` bytes.
  virtual int64_t scratch_need(int64_t numel, int64_t elem) const = 0;

  Communicator& comm_;
  Scratch scratch_;
  AlgorithmOptions options_;

 private:
  Algorithm kind_;
  int tag_;
  Millis timeout_;
};

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

class RingAlgorithm : public CollectiveAlgorithm {
 public:
  RingAlgorithm(Communicator& comm, const AlgorithmOptions& options = {});
  // Reduce-scatter then all-gather, 2(n-1) steps; pipelined: a piece is combined and sent on to the next rank
  // while the following pieces are still arriving (options.piece_bytes).
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  // Pipelined chain root -> root+1 -> ...: the buffer moves in ring_broadcast_segments() pieces.
  void broadcast(at::Tensor& tensor, int root) override;

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;
};

class TreeAlgorithm : public CollectiveAlgorithm {
 public:
  TreeAlgorithm(Communicator& comm, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root) override;
  // Binomial reduce: the result lands in `tensor` on root (avg divided there); other buffers are left partial.
  void reduce(at::Tensor& tensor, int root, ReduceOp op);
  // Binomial gather: `output` (size() x input) is filled on root only; other ranks' outputs hold partial slices.
  void gather(const at::Tensor& input, at::Tensor& output, int root);
  // Binomial scatter: `input` (size() x output) is read on root only.
  void scatter(const at::Tensor& input, at::Tensor& output, int root);

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;
};

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

// Groups for the hierarchical algorithm: consecutive blocks of `group_size` ranks (a host's ranks are
// consecutive under the launcher). Collective over `world`.
struct Hierarchy {
  std::unique_ptr<Communicator> local;    // this rank's group (null when group_size == 1)
  std::unique_ptr<Communicator> leaders;  // the first rank of every group (null on the others)
};
Hierarchy make_hierarchy(Communicator& world, int group_size);

class HierarchicalAlgorithm : public CollectiveAlgorithm {
 public:
  // Splits `world` into groups of options.group_size ranks (collective over `world`).
  HierarchicalAlgorithm(Communicator& world, const AlgorithmOptions& options);
  // Uses groups made by make_hierarchy, which must outlive this object.
  HierarchicalAlgorithm(Communicator& world, Hierarchy& hierarchy, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void reserve(int64_t numel, at::ScalarType dtype) override;
  int allocations() const override;
  int64_t scratch_bytes() const override;
  int group_size() const { return group_size_; }

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;

 private:
  void build();
  Hierarchy owned_;
  Hierarchy* h_;
  int group_size_ = 1;
  std::unique_ptr<TreeAlgorithm> inside_;           // on h_->local
  std::unique_ptr<CollectiveAlgorithm> across_;     // on h_->leaders
};

// Builds the object for `a` (Hierarchical needs options.group_size and splits `comm`: collective).
std::unique_ptr<CollectiveAlgorithm> make_algorithm(Algorithm a, Communicator& comm, const AlgorithmOptions& options = {});

// --- one-shot wrappers (build an object for one call; scratch is allocated per call) -------------------------
void ring_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);
void ring_reduce_scatter(Communicator& c, const at::Tensor& in, at::Tensor& out, ReduceOp op, int tag = kDefaultTag);
void ring_all_gather(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = kDefaultTag);
void ring_broadcast(Communicator& c, at::Tensor& t, int root, int segments = 8, int tag = kDefaultTag);

void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag = kDefaultTag);
void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag = kDefaultTag);
void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = kDefaultTag);

void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
