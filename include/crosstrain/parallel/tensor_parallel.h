// Tensor- and sequence-parallel communication as conjugate autograd functions (Megatron's mappings).
// Every function is the identity when `group` is null (a group of one rank). Tensors are [batch, seq, hidden].
#pragma once

#include <ATen/core/Tensor.h>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::parallel::tp {

// forward: identity; backward: all-reduce (sum). Enters a column-parallel region.
at::Tensor copy_to_region(const at::Tensor& x, comm::Communicator* group);
// forward: all-reduce (sum); backward: identity. Leaves a row-parallel region.
at::Tensor reduce_from_region(const at::Tensor& x, comm::Communicator* group);
// forward: keep this rank's slice of the last dim; backward: all-gather along the last dim.
at::Tensor scatter_to_region(const at::Tensor& x, comm::Communicator* group);
// forward: all-gather along the last dim; backward: keep this rank's slice.
at::Tensor gather_from_region(const at::Tensor& x, comm::Communicator* group);

// Sequence parallel: the sequence (dim 1) is split over the group outside the tensor-parallel regions.
// forward: keep this rank's slice of the sequence; backward: all-gather along the sequence.
at::Tensor scatter_to_sequence(const at::Tensor& x, comm::Communicator* group);
// forward: all-gather along the sequence; backward: reduce-scatter along the sequence.
at::Tensor gather_from_sequence(const at::Tensor& x, comm::Communicator* group);
// forward: reduce-scatter along the sequence; backward: all-gather along the sequence.
at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, comm::Communicator* group);

// Mean cross-entropy over rows of logits whose vocabulary (last dim) is split over the group (null: one rank);
// rows whose target is -100 (torch's ignore_index: a masked prompt token) are left out of the mean, and the
// loss is 0 when every row is left out. This rank holds
// vocabulary entries [vocab_start, vocab_start + logits.size(-1)). The full logits are never gathered: the
// max, the sum of exponentials and the target logit are all-reduced (three small collectives per call).
at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        comm::Communicator* group);

}  // namespace crosstrain::parallel::tp
