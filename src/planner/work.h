// Private to the planner: the work of one micro-batch on one tensor-parallel rank (seconds of products,
// element-wise passes, operator dispatch and exposed tensor-parallel collectives) for a block, the embedding and
// the head, and the stage split. Shared by estimate.cpp and memory.cpp.
#pragma once

#include <string>
#include <vector>

#include "crosstrain/planner/estimate.h"
#include "crosstrain/planner/placement.h"

namespace crosstrain::planner::detail {

// Bytes of one activation element in the layout's compute precision.
double activation_element_bytes(const Layout& layout);
std::string compute_dtype(const Layout& layout);

// Seconds of one micro-batch of one piece of the model on one device.
struct PieceCost {
  double forward = 0;          // compute, tp collectives excluded
  double backward_input = 0;   // input gradients (with recompute's extra forward)
  double backward_weight = 0;  // weight gradients
  double tp_forward = 0;       // exposed tensor-parallel collectives
  double tp_backward = 0;

  PieceCost& operator+=(const PieceCost& o);
  PieceCost scaled(double factor) const;
};

struct PieceCosts {
  PieceCost block, embedding, head;
};

// The costs on `device` (slowed down by `slowdown`), with tensor-parallel collectives over `tp_link`.
// `tp_host`: the cluster when the tp group shares one host (its measured all-reduce applies to fp32), else null.
PieceCosts piece_costs(const ModelShape& model, const Layout& layout, const DeviceType& device, double slowdown,
                       const comm::Link& tp_link, const ClusterSpec* tp_host = nullptr);

// The fastest of our all-reduce, reduce-scatter or all-gather algorithms (what algo=auto picks) on one link. A
// float all-reduce inside one host whose cluster measured its shared-memory path (`same_host`) takes that curve:
// each rank writes its buffer once and reads all n, so it scales as (1 + n) / (1 + measured ranks).
double collective_seconds(comm::Collective op, double bytes, int n, const comm::Link& link,
                          const ClusterSpec* same_host = nullptr, bool bf16 = false);

// Blocks of each virtual stage as bounds (first block of each, then the end): the layout's stage_layers, else a
// split that balances block, embedding and head costs (relative, by parameters, as models::partition_gpt weighs
// them) over `speed` (relative speed of the device of each virtual stage). Equal speeds on a small model give the
// trainer's own split exactly.
std::vector<int64_t> stage_bounds(const ModelShape& model, const Layout& layout, const std::vector<double>& speed);

// A model's parameter counts by piece, computed once per estimate (the search asks for them per candidate).
struct ParameterCounts {
  double block = 0, embedding = 0, head = 0;  // head: with the final norm (and the tied table on a later stage)
  double tied_table = 0;                      // vocab x hidden when the head shares the embedding, else 0
  explicit ParameterCounts(const ModelShape& model);
};
// Parameters a virtual stage holds, before tensor-parallel sharding.
double stage_parameters(const ParameterCounts& counts, int64_t first_block, int64_t end_block, bool first, bool last);
// Parameter tensors of a stage (what a per-tensor optimizer loops over).
double stage_tensors(const ModelShape& model, int64_t blocks, bool first, bool last);

}  // namespace crosstrain::planner::detail
