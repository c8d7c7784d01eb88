#include "crosstrain/parallel/mesh.h"

namespace crosstrain::parallel {

Mesh::Mesh(comm::Communicator& world, MeshShape shape) : world_(world), shape_(shape) {
  shape_.check(world.size());
  coords_ = shape_.coords(world.rank());
  for (Axis axis : {Axis::PP, Axis::DP, Axis::TP}) {
    if (shape_[axis] == 1) continue;
    // split() is collective over the world: every rank walks every group of the axis in the same order.
    for (const auto& ranks : shape_.all_groups(axis)) {
      auto g = world.split(ranks);
      if (g) groups_[static_cast<int>(axis)] = std::move(g);
    }
  }
  // Without pipeline stages a replica's ranks are its tensor-parallel group: no group of its own to form (each
  // formation costs round trips to the store, across a wide-area link in elastic generations).
  if (shape_.dp > 1 && shape_.pp > 1)
    for (const auto& ranks : shape_.replica_groups()) {
      auto g = world.split(ranks);
      if (g) replica_ = std::move(g);
    }
  const int width = shape_.shard_width();
  if (width > 1 && width < shape_.dp) {
    for (const auto& ranks : shape_.shard_groups())
      if (auto g = world.split(ranks)) shard_ = std::move(g);
    for (const auto& ranks : shape_.replicate_groups())
      if (auto g = world.split(ranks)) replicate_ = std::move(g);
  }
}

comm::Communicator* Mesh::shard_group() const {
  const int width = shape_.shard_width();
  return width == shape_.dp ? group(Axis::DP) : width == 1 ? nullptr : shard_.get();
}

comm::Communicator* Mesh::replicate_group() const {
  const int width = shape_.shard_width();
  return width == shape_.dp ? nullptr : width == 1 ? group(Axis::DP) : replicate_.get();
}

int Mesh::pipeline_peer(int pp_index) const {
  MeshCoords c = coords_;
  c.pp = pp_index;
  return shape_.rank_of(c);
}

}  // namespace crosstrain::parallel
