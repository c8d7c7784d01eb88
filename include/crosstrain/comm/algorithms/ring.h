// The ring (RingAlgorithm): bandwidth-optimal, every rank sends 2(n-1)/n of the buffer in an all-reduce, in
// 2(n-1) steps (latency grows with n). All-reduce is reduce-scatter then all-gather, pipelined in pieces;
// reduce-scatter and all-gather are n-1 steps of 1/n of the buffer each; broadcast is a pipelined chain from the
// root. Also: the pieces of that chain (ring_broadcast_segments, which the cost model counts too) and the one-shot
// ring wrappers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

// Pieces of the ring broadcast's pipelined chain for a buffer of `bytes` on n ranks: at most `most`, each at least
// kMinBroadcastSegment bytes (a smaller piece costs more in per-message latency than the pipeline saves), and one
// on 2 ranks, where there is no one to forward to. Pure; the cost model counts the same pieces.
constexpr int64_t kMinBroadcastSegment = 64 << 10;
int ring_broadcast_segments(int64_t bytes, int n, int most);

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

// --- one-shot wrappers (build an object for one call; scratch is allocated per call) -------------------------
void ring_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);
void ring_reduce_scatter(Communicator& c, const at::Tensor& in, at::Tensor& out, ReduceOp op, int tag = kDefaultTag);
void ring_all_gather(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = kDefaultTag);
void ring_broadcast(Communicator& c, at::Tensor& t, int root, int segments = 8, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
