// The collective conformance suite: every operation of a Communicator against reduce_reference(), over
// dtypes and buffer sizes. Shared by the in-process tests (ranks as threads) and the multi-process workers,
// so it reports failures as strings instead of using gtest macros.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::testing {

struct ConformanceOptions {
  std::vector<int64_t> sizes{0, 1, 7, 262147};  // elements per rank; the last is > 1 MiB of float
  bool all_dtypes = true;                        // otherwise float, int64 and bfloat16 only
  int64_t large_only_for_float = 4096;           // sizes above this run for float only
};

// Runs every check on this rank; returns human-readable failures (empty when all passed).
std::vector<std::string> run_conformance(comm::Communicator& c, const ConformanceOptions& options = {});

// The input rank `rank` contributes for (dtype, numel, salt); values keep every reduction exact.
at::Tensor conformance_input(int rank, at::ScalarType dtype, int64_t numel, int salt, bool for_product = false);

}  // namespace crosstrain::testing
