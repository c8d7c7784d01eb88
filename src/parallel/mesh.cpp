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
  if (shape_.dp > 1 && shape_.pp * shape_.tp > 1)
    for (const auto& ranks : shape_.replica_groups()) {
      auto g = world.split(ranks);
      if (g) replica_ = std::move(g);
    }
}

int Mesh::pipeline_peer(int pp_index) const {
  MeshCoords c = coords_;
  c.pp = pp_index;
  return shape_.rank_of(c);
}

}  // namespace crosstrain::parallel
