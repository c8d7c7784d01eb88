// Our collective algorithms against reduce_reference(): every collective of one algorithm object over dtypes,
// reductions, roots and buffer sizes. Shared by the in-process tests (ranks as threads) and the Gloo worker
// (real processes), so failures come back as strings instead of gtest macros.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "crosstrain/comm/algorithms/collectives.h"

namespace crosstrain::testing {

struct AlgorithmCheckOptions {
  // Elements of the all-reduce and broadcast buffer; per rank for reduce-scatter, all-gather and all-to-all.
  std::vector<int64_t> sizes{0, 1, 7, 4099};
  int64_t large = 262147;  // one more size (> 1 MiB of float), float only; 0: none
  std::vector<at::ScalarType> dtypes{at::kFloat, at::kLong, at::kBFloat16};
};

struct AlgorithmVariant {
  comm::algo::Algorithm algorithm;
  int group_size = 0;  // hierarchical only
  int64_t piece_bytes = -1;  // ring: AlgorithmOptions::piece_bytes; -1: the default
  std::string name() const;
};

// The variants of `a` for a world of n ranks: one; for Ring also one cut into pieces of 64 bytes (pipelined over
// up to 16 pieces, uneven ones included); for Hierarchical one per group size that divides n.
std::vector<AlgorithmVariant> algorithm_variants(comm::algo::Algorithm a, int n);

// Runs every check on this rank with one object of the variant (its scratch reserved once up front, and checked
// not to grow); returns human-readable failures, empty when all passed. Collective over `c`.
std::vector<std::string> check_algorithm(comm::Communicator& c, const AlgorithmVariant& variant,
                                         const AlgorithmCheckOptions& options = {});

}  // namespace crosstrain::testing
