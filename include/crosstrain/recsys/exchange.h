// Variable-size all-to-all (MPI's alltoallv): what embedding lookups need, since every rank asks every other
// rank for a different number of rows. The group's all_to_all moves equal slices only; padding every slice to
// the largest would send the skew of hot ids to everyone, so the pieces move point to point instead.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::recsys {

// Counts of a [size, k] int64 matrix (row r: what this rank sends to rank r) -> the [size, k] matrix of what
// each rank sends to this one (one all_to_all).
at::Tensor exchange_counts(comm::Communicator& c, const at::Tensor& counts);

// `send[r]` (1-D, one dtype) goes to rank r; returns what each rank sent here, each `recv_numel[r]` elements
// long (the caller knows them: from exchange_counts, or from the request it answers). Pairwise rounds: in
// round k a rank sends to rank + k and receives from rank - k; empty pieces are skipped on both sides.
// `bytes_sent` (optional) adds the bytes sent to other ranks.
std::vector<at::Tensor> all_to_all_v(comm::Communicator& c, const std::vector<at::Tensor>& send,
                                     const std::vector<int64_t>& recv_numel, int64_t* bytes_sent = nullptr);

}  // namespace crosstrain::recsys
