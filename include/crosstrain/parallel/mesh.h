// The device mesh: named axes (pp, dp, tp), built once. Rank arithmetic is pure (MeshShape); Mesh adds the
// sub-groups, created in the same order on every rank, with no group for an axis of size 1.
//
// Layout (Megatron's order): tp varies fastest, then dp, then pp:
//   rank = (pp_index * dp + dp_index) * tp + tp_index
// so a tensor-parallel group is a run of neighbouring ranks (the fastest links) and pipeline stages are far apart.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::parallel {

enum class Axis { PP = 0, DP = 1, TP = 2 };
constexpr int kAxes = 3;
const char* to_string(Axis axis);

struct MeshCoords {
  int pp = 0, dp = 0, tp = 0;
  int operator[](Axis a) const { return a == Axis::PP ? pp : a == Axis::DP ? dp : tp; }
};

struct MeshShape {
  int pp = 1, dp = 1, tp = 1;

  int size() const { return pp * dp * tp; }
  int operator[](Axis a) const { return a == Axis::PP ? pp : a == Axis::DP ? dp : tp; }
  // Throws UsageError printing every factor when the product is not the world size.
  void check(int world) const;
  MeshCoords coords(int rank) const;
  int rank_of(const MeshCoords& c) const;
  // The ranks of `rank`'s group along `axis`, in axis order.
  std::vector<int> group(Axis axis, int rank) const;
  // Every group along `axis`, each in axis order, groups in increasing order of their first rank.
  std::vector<std::vector<int>> all_groups(Axis axis) const;
  // The ranks of each model replica (one data-parallel index: every pp x tp rank of it), ascending.
  std::vector<std::vector<int>> replica_groups() const;
};

class Mesh {
 public:
  // Collective over `world`: builds every axis' groups in the same order on all ranks.
  Mesh(comm::Communicator& world, MeshShape shape);
  const MeshShape& shape() const { return shape_; }
  const MeshCoords& coords() const { return coords_; }
  comm::Communicator& world() const { return world_; }
  // This rank's group along `axis`; nullptr when the axis has size 1 (nothing to communicate).
  comm::Communicator* group(Axis axis) const { return groups_[static_cast<int>(axis)].get(); }
  int size(Axis axis) const { return shape_[axis]; }
  int index(Axis axis) const { return coords_[axis]; }
  // The ranks of this rank's model replica (its pp x tp ranks): the losses and gradient norm of one replica are
  // summed here, so replicas that run apart (asynchronous sync modes) never wait for each other. The world when
  // there is one replica; nullptr when a replica is one rank.
  comm::Communicator* replica_group() const { return shape_.dp == 1 && shape_.size() > 1 ? &world_ : replica_.get(); }
  // World rank of the neighbour that differs from this rank only in its pipeline index.
  int pipeline_peer(int pp_index) const;

 private:
  comm::Communicator& world_;
  MeshShape shape_;
  MeshCoords coords_;
  std::array<std::unique_ptr<comm::Communicator>, kAxes> groups_;
  std::unique_ptr<comm::Communicator> replica_;
};

}  // namespace crosstrain::parallel
