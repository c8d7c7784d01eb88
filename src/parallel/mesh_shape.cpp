#include "crosstrain/parallel/mesh_shape.h"

#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {

const char* to_string(Axis axis) {
  switch (axis) {
    case Axis::PP: return "pp";
    case Axis::DP: return "dp";
    case Axis::TP: return "tp";
  }
  return "?";
}

void MeshShape::check(int world) const {
  if (pp < 1 || dp < 1 || tp < 1 || size() != world)
    throw UsageError("parallel layout dp=" + std::to_string(dp) + " x pp=" + std::to_string(pp) + " x tp=" +
                     std::to_string(tp) + " = " + std::to_string(size()) + " does not match the " +
                     std::to_string(world) + " ranks of the job; set parallel.dp, parallel.pp and parallel.tp so " +
                     "that their product is " + std::to_string(world));
  if (dp_shard < 0 || (dp_shard > 0 && dp % dp_shard != 0))
    throw UsageError("parallel.dp_shard = " + std::to_string(dp_shard) + " must divide the " + std::to_string(dp) +
                     " data-parallel ranks (each group of dp_shard ranks shards one copy of the state); 0 shards "
                     "over all of them");
}

MeshCoords MeshShape::coords(int rank) const {
  MeshCoords c;
  c.tp = rank % tp;
  c.dp = (rank / tp) % dp;
  c.pp = rank / (tp * dp);
  return c;
}

int MeshShape::rank_of(const MeshCoords& c) const { return (c.pp * dp + c.dp) * tp + c.tp; }

std::vector<int> MeshShape::group(Axis axis, int rank) const {
  MeshCoords c = coords(rank);
  std::vector<int> ranks;
  for (int i = 0; i < (*this)[axis]; ++i) {
    MeshCoords m = c;
    (axis == Axis::PP ? m.pp : axis == Axis::DP ? m.dp : m.tp) = i;
    ranks.push_back(rank_of(m));
  }
  return ranks;
}

std::vector<std::vector<int>> MeshShape::all_groups(Axis axis) const {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < size(); ++r)
    if (coords(r)[axis] == 0) groups.push_back(group(axis, r));
  return groups;
}

std::vector<std::vector<int>> MeshShape::replica_groups() const {
  std::vector<std::vector<int>> groups(dp);
  for (int r = 0; r < size(); ++r) groups[coords(r).dp].push_back(r);
  return groups;
}

std::vector<std::vector<int>> MeshShape::shard_groups() const {
  const int width = shard_width();
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < size(); ++r) {
    const MeshCoords c = coords(r);
    if (c.dp % width != 0) continue;
    groups.emplace_back();
    for (int i = 0; i < width; ++i) groups.back().push_back(rank_of({c.pp, c.dp + i, c.tp}));
  }
  return groups;
}

std::vector<std::vector<int>> MeshShape::replicate_groups() const {
  const int width = shard_width();
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < size(); ++r) {
    const MeshCoords c = coords(r);
    if (c.dp >= width) continue;
    groups.emplace_back();
    for (int copy = 0; copy < state_copies(); ++copy) groups.back().push_back(rank_of({c.pp, c.dp + copy * width, c.tp}));
  }
  return groups;
}

}  // namespace crosstrain::parallel
