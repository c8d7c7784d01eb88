// The hierarchical algorithm (HierarchicalAlgorithm): the world in groups of g consecutive ranks (a host, a
// cluster; make_hierarchy), a binomial TreeAlgorithm inside each group and options.across (ring by default) among
// the n/g group leaders, so that only the leaders use the slow links. An all-reduce reduces to the group leader,
// all-reduces among the leaders and broadcasts in the group; reduce-scatter, all-gather and broadcast follow the
// same pattern. Also the one-shot hierarchical_all_reduce.
#include "crosstrain/comm/algorithms/hierarchical.h"

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "algorithm_util.h"
#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {

using namespace detail;

namespace {

ReduceOp without_avg(ReduceOp op) { return op == ReduceOp::Avg ? ReduceOp::Sum : op; }

}  // namespace

Hierarchy make_hierarchy(Communicator& world, int group_size) {
  const int n = world.size();
  if (group_size < 1 || n % group_size != 0)
    throw UsageError("hierarchical: " + std::to_string(n) + " ranks do not split into groups of " +
                     std::to_string(group_size));
  Hierarchy h;
  if (group_size > 1) {
    for (int g = 0; g < n / group_size; ++g) {
      std::vector<int> ranks;
      for (int i = 0; i < group_size; ++i) ranks.push_back(g * group_size + i);
      auto sub = world.split(ranks);
      if (sub) h.local = std::move(sub);
    }
  }
  std::vector<int> leaders;
  for (int g = 0; g < n / group_size; ++g) leaders.push_back(g * group_size);
  h.leaders = world.split(leaders);
  return h;
}

HierarchicalAlgorithm::HierarchicalAlgorithm(Communicator& world, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Hierarchical, world, options), h_(&owned_) {
  if (options.group_size < 1)
    throw UsageError("hierarchical: set group_size (ranks per group, e.g. the ranks of one host)");
  owned_ = make_hierarchy(world, options.group_size);
  build();
}

HierarchicalAlgorithm::HierarchicalAlgorithm(Communicator& world, Hierarchy& hierarchy, const AlgorithmOptions& options)
    : CollectiveAlgorithm(Algorithm::Hierarchical, world, options), h_(&hierarchy) {
  build();
}

void HierarchicalAlgorithm::build() {
  if (options_.across == Algorithm::Hierarchical)
    throw UsageError("hierarchical: the algorithm across group leaders must be builtin, ring, tree or hd");
  group_size_ = h_->local ? h_->local->size() : 1;
  if (comm_.size() % group_size_ != 0)
    throw UsageError("hierarchical: the groups do not divide the " + std::to_string(comm_.size()) + " ranks");
  AlgorithmOptions sub = options_;
  sub.reserve_numel = 0;
  if (h_->local) inside_ = std::make_unique<TreeAlgorithm>(*h_->local, sub);
  if (h_->leaders) across_ = make_algorithm(options_.across, *h_->leaders, sub);
  if (options_.reserve_numel > 0) reserve(options_.reserve_numel, options_.reserve_dtype);
}

int64_t HierarchicalAlgorithm::scratch_need(int64_t numel, int64_t elem) const {
  return Scratch::bytes_for({numel * elem, numel / std::max(1, comm_.size() / group_size_) * elem});
}

void HierarchicalAlgorithm::reserve(int64_t numel, at::ScalarType dtype) {
  CollectiveAlgorithm::reserve(numel, dtype);
  if (inside_) inside_->reserve(numel, dtype);
  if (across_) across_->reserve(numel, dtype);
}

int HierarchicalAlgorithm::allocations() const {
  return scratch_.allocations() + (inside_ ? inside_->allocations() : 0) + (across_ ? across_->allocations() : 0);
}

int64_t HierarchicalAlgorithm::scratch_bytes() const {
  return scratch_.capacity() + (inside_ ? inside_->scratch_bytes() : 0) + (across_ ? across_->scratch_bytes() : 0);
}

void HierarchicalAlgorithm::all_reduce(at::Tensor& t, ReduceOp op) {
  check_flat("hierarchical all-reduce", t);
  const ReduceOp inner = without_avg(op);
  if (inside_) inside_->reduce(t, 0, inner);
  if (across_) across_->all_reduce(t, inner);
  if (inside_) inside_->broadcast(t, 0);
  finish_avg(t, op, comm_.size());
}

void HierarchicalAlgorithm::reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) {
  const int n = comm_.size(), g = group_size_;
  check_sliced("hierarchical reduce-scatter", out, in, n);
  const ReduceOp inner = without_avg(op);
  if (!inside_) {
    across_->reduce_scatter(in, out, inner);
    return finish_avg(out, op, n);
  }
  // Reduce the whole buffer to the group leader, reduce-scatter blocks of g slices across leaders (leader of
  // group G gets the slices of ranks G*g ..), then scatter the block inside the group.
  scratch_.reset();
  at::Tensor work = scratch_.take(in.numel(), in.scalar_type());
  at::Tensor block = scratch_.take(out.numel() * g, in.scalar_type());
  work.copy_(in.view({-1}));
  inside_->reduce(work, 0, inner);
  if (across_) across_->reduce_scatter(work, block, inner);
  inside_->scatter(block, out, 0);
  finish_avg(out, op, n);
}

void HierarchicalAlgorithm::all_gather(const at::Tensor& in, at::Tensor& out) {
  const int n = comm_.size(), g = group_size_;
  check_sliced("hierarchical all-gather", in, out, n);
  if (!inside_) return across_->all_gather(in, out);
  scratch_.reset();
  at::Tensor block = scratch_.take(in.numel() * g, in.scalar_type());
  inside_->gather(in, block, 0);
  if (across_) across_->all_gather(block, out);
  inside_->broadcast(out, 0);
}

void HierarchicalAlgorithm::broadcast(at::Tensor& t, int root) {
  check_flat("hierarchical broadcast", t);
  const int n = comm_.size(), g = group_size_, r = comm_.rank();
  if (root < 0 || root >= n) throw UsageError("hierarchical broadcast: root " + std::to_string(root) + " is not a rank");
  // The root hands the buffer to its group's leader, the leaders broadcast, every leader broadcasts inside.
  const int leader = root / g * g;
  if (root != leader) {
    Links l(comm_, timeout());
    if (r == root) l.send(t.view({-1}), leader, tag());
    else if (r == leader) l.recv(t.view({-1}), root, tag());
  }
  if (across_) across_->broadcast(t, root / g);
  if (inside_) inside_->broadcast(t, 0);
}

// --- one-shot wrapper --------------------------------------------------------------------------------------------

void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag) {
  HierarchicalAlgorithm(world, h, with_tag(tag)).all_reduce(t, op);
}

}  // namespace crosstrain::comm::algo
