// The hierarchical algorithm (HierarchicalAlgorithm): groups of consecutive ranks (a host, a cluster), a binomial
// tree (TreeAlgorithm) inside each group and an algorithm of choice (ring by default) across the group leaders, so
// that only leaders use the slow links: an all-reduce reduces to the leader, all-reduces among the leaders and
// broadcasts in the group. Also the groups themselves (Hierarchy, make_hierarchy) and the one-shot
// hierarchical_all_reduce.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

#include "crosstrain/comm/algorithms/collective_algorithm.h"
#include "crosstrain/comm/algorithms/tree.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm::algo {

// Groups for the hierarchical algorithm: consecutive blocks of `group_size` ranks (a host's ranks are
// consecutive under the launcher). Collective over `world`.
struct Hierarchy {
  std::unique_ptr<Communicator> local;    // this rank's group (null when group_size == 1)
  std::unique_ptr<Communicator> leaders;  // the first rank of every group (null on the others)
};
Hierarchy make_hierarchy(Communicator& world, int group_size);

class HierarchicalAlgorithm : public CollectiveAlgorithm {
 public:
  // Splits `world` into groups of options.group_size ranks (collective over `world`).
  HierarchicalAlgorithm(Communicator& world, const AlgorithmOptions& options);
  // Uses groups made by make_hierarchy, which must outlive this object.
  HierarchicalAlgorithm(Communicator& world, Hierarchy& hierarchy, const AlgorithmOptions& options = {});
  void all_reduce(at::Tensor& tensor, ReduceOp op) override;
  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override;
  void all_gather(const at::Tensor& input, at::Tensor& output) override;
  void broadcast(at::Tensor& tensor, int root) override;
  void reserve(int64_t numel, at::ScalarType dtype) override;
  int allocations() const override;
  int64_t scratch_bytes() const override;
  int group_size() const { return group_size_; }

 protected:
  int64_t scratch_need(int64_t numel, int64_t elem) const override;

 private:
  void build();
  Hierarchy owned_;
  Hierarchy* h_;
  int group_size_ = 1;
  std::unique_ptr<TreeAlgorithm> inside_;           // on h_->local
  std::unique_ptr<CollectiveAlgorithm> across_;     // on h_->leaders
};

// One-shot (builds an object for one call; scratch is allocated per call).
void hierarchical_all_reduce(Communicator& world, Hierarchy& h, at::Tensor& t, ReduceOp op, int tag = kDefaultTag);

}  // namespace crosstrain::comm::algo
