// Collective algorithms of our own, on a communicator's point-to-point primitives (send/recv with tags).
// Each call is synchronous, uses tags [tag, tag + steps) and the communicator's timeout for every receive.
// Buffers follow the Communicator conventions (flat slices, slice i belongs to rank i).
//
//   ring             n-1 steps each way; every rank sends 2(n-1)/n of the buffer (bandwidth-optimal)
//   tree             binomial: ceil(log2 n) steps each way; the whole buffer per step (latency-optimal)
//   halving-doubling Rabenseifner: recursive halving reduce-scatter + recursive doubling all-gather,
//                    2 log2 n steps, 2(n-1)/n of the buffer; non-powers of two fold the extra ranks first
//   hierarchical     reduce inside each group of ranks (a host, a cluster), all-reduce across the group
//                    leaders, broadcast inside: only leaders use the slow links
//
// Every rank ends with the same bits: each element is reduced once, on one rank, and then copied.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

enum class Algorithm { Builtin, Ring, Tree, HalvingDoubling, Hierarchical };
// "builtin", "ring", "tree", "hd" (or "halving-doubling"), "hierarchical"; throws UsageError listing them.
Algorithm parse_algorithm(const std::string& name);
const char* to_string(Algorithm a);

void ring_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = 1 << 20);
void ring_reduce_scatter(Communicator& c, const at::Tensor& in, at::Tensor& out, ReduceOp op, int tag = 1 << 20);
void ring_all_gather(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = 1 << 20);
// Pipelined chain root -> root+1 -> ...: the buffer moves in `segments` pieces.
void ring_broadcast(Communicator& c, at::Tensor& t, int root, int segments = 8, int tag = 1 << 20);

void tree_broadcast(Communicator& c, at::Tensor& t, int root, int tag = 1 << 20);
void tree_reduce(Communicator& c, at::Tensor& t, int root, ReduceOp op, int tag = 1 << 20);
void tree_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = 1 << 20);

void halving_doubling_all_reduce(Communicator& c, at::Tensor& t, ReduceOp op, int tag = 1 << 20);

void pairwise_all_to_all(Communicator& c, const at::Tensor& in, at::Tensor& out, int tag = 1 << 20);

// Groups for the hierarchical algorithm: consecutive blocks of `group_size` ranks (a host's ranks are
// consecutive under the launcher). Collective over `world`.
struct Hierarchy {
  std::unique_ptr<Communicator> local;    // this rank's group (null when group_size == 1)
  std::unique_ptr<Communicator> leaders;  // the first rank of every group (null on the others)
};
Hierarchy make_hierarchy(Communicator& world, int group_size);
void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag = 1 << 20);

}  // namespace crosstrain::comm::algo
