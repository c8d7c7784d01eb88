// Rank arithmetic of the device mesh (named axes pp, dp, tp), pure: no communication, no libtorch.
//
// Layout (Megatron's order): tp varies fastest, then dp, then pp:
//   rank = (pp_index * dp + dp_index) * tp + tp_index
// so a tensor-parallel group is a run of neighbouring ranks (the fastest links) and pipeline stages are far apart.
#pragma once

#include <vector>

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

}  // namespace crosstrain::parallel
