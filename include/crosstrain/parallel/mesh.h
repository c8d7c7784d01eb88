// The device mesh: named axes (pp, dp, tp), built once. Rank arithmetic is pure (MeshShape, mesh_shape.h);
// Mesh adds the sub-groups, created in the same order on every rank, with no group for an axis of size 1.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/mesh_shape.h"

namespace crosstrain::parallel {

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
  comm::Communicator* replica_group() const {
    if (shape_.dp == 1) return shape_.size() > 1 ? &world_ : nullptr;
    return shape_.pp == 1 ? group(Axis::TP) : replica_.get();
  }
  // World rank of the neighbour that differs from this rank only in its pipeline index.
  int pipeline_peer(int pp_index) const;
  // HSDP (shape().dp_shard): the data-parallel ranks that shard one copy of the state with this rank, and the ranks
  // that hold this rank's shard in the other copies. nullptr for a group of one rank. Without HSDP the shard group
  // is the data-parallel group and there is no replicate group.
  comm::Communicator* shard_group() const;
  comm::Communicator* replicate_group() const;
  int shard_index() const { return coords_.dp % shape_.shard_width(); }
  int copy_index() const { return coords_.dp / shape_.shard_width(); }

 private:
  comm::Communicator& world_;
  MeshShape shape_;
  MeshCoords coords_;
  std::array<std::unique_ptr<comm::Communicator>, kAxes> groups_;
  std::unique_ptr<comm::Communicator> replica_;
  std::unique_ptr<comm::Communicator> shard_, replicate_;  // HSDP with 1 < dp_shard < dp
};

}  // namespace crosstrain::parallel
