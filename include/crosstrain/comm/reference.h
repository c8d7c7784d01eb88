// Reference semantics of reductions, shared by the in-process back end and the tests.
// Folds inputs in rank order, so every rank computes bit-identical results.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// Reduces equally shaped tensors. Avg of integers truncates toward zero; Sum of bools is logical or,
// Product logical and. Throws UsageError for combinations that have no meaning (avg of bools, min of complex).
at::Tensor reduce_reference(const std::vector<at::Tensor>& inputs, ReduceOp op);

}  // namespace crosstrain::comm
