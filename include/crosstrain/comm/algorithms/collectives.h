// Collective algorithms of our own, on a communicator's point-to-point primitives (send/recv with tags): this
// header includes them all and declares make_algorithm. One header per algorithm, beside this one, and one source
// file each in src/comm/algorithms/:
//
//   collective_algorithm.h  Algorithm, AlgorithmOptions, Scratch, CollectiveAlgorithm (the interface, its contract)
//   builtin.h               BuiltinAlgorithm: the back end's own collectives behind the same interface
//   ring.h                  RingAlgorithm, ring_broadcast_segments, ring_* one-shot wrappers
//   tree.h                  TreeAlgorithm (binomial; also rooted reduce, gather, scatter), tree_* wrappers
//   halving_doubling.h      HalvingDoublingAlgorithm, halving_doubling_all_reduce
//   hierarchical.h          Hierarchy, make_hierarchy, HierarchicalAlgorithm, hierarchical_all_reduce
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

#include <memory>

#include "crosstrain/comm/algorithms/builtin.h"
#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/algorithms/halving_doubling.h"
#include "crosstrain/comm/algorithms/hierarchical.h"
#include "crosstrain/comm/algorithms/ring.h"
#include "crosstrain/comm/algorithms/tree.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

// Builds the object for `a` (Hierarchical needs options.group_size and splits `comm`: collective).
std::unique_ptr<CollectiveAlgorithm> make_algorithm(Algorithm a, Communicator& comm, const AlgorithmOptions& options = {});

}  // namespace crosstrain::comm::algo
