// What every collective algorithm of our own shares: the `Algorithm` names, `AlgorithmOptions`, the scratch memory
// of an object (`Scratch`) and the interface each algorithm implements (`CollectiveAlgorithm`, with the pairwise
// all-to-all every algorithm inherits). The algorithms have a header each beside this one; collectives.h includes
// them all, compares them and declares make_algorithm.
//
// Each algorithm is an object (CollectiveAlgorithm) built on one communicator with a tag, a timeout and its own
// scratch buffers: reserve(numel, dtype) allocates them once for buffers up to that size, and every later call
// reuses them (allocations() counts the times they grew). Calls are synchronous, use the tags
// [tag, tag + kTagsPerCall) of the communicator, and wait at most `timeout` for every send and receive. Buffers
// follow the Communicator conventions (flat contiguous tensors; slice i of a sliced buffer belongs to rank i).
// All members must call the same operations in the same order, as with the built-in collectives. An object is
// not thread-safe.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

enum class Algorithm { Builtin, Ring, Tree, HalvingDoubling, Hierarchical };
// "builtin", "ring", "tree", "hd" (or "halving-doubling"), "hierarchical"; throws UsageError listing them.
// Defined with make_algorithm in collectives.cpp.
Algorithm parse_algorithm(const std::string& name);
const char* to_string(Algorithm a);

constexpr int kDefaultTag = 1 << 20;
// Tags one call may use, starting at the object's tag. Objects used on the same communicator in the same order
// on every rank may share tags (messages of one pair and tag arrive in order); distinct ranges keep them apart.
constexpr int kTagsPerCall = 8;

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

// One-shot (builds an object for one call; scratch is allocated per call): the pairwise all-to-all.
void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
