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
  // ZeRO shards the model state over groups of this many neighbouring data-parallel ranks and keeps a copy per
  // group (HSDP: data-parallel index = replicate index x dp_shard + shard index). 0: one group of all dp ranks.
  int dp_shard = 0;

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

  // HSDP. The data-parallel ranks that share one copy of the sharded state (dp when dp_shard is 0).
  int shard_width() const { return dp_shard > 0 ? dp_shard : dp; }
  // Copies of the sharded state: dp / shard_width().
  int state_copies() const { return dp / shard_width(); }
  // Every group of shard_width() data-parallel ranks that shards one copy (same pp and tp), and every group of the
  // ranks that hold the same shard in each copy; each in data-parallel order, groups by their first rank.
  std::vector<std::vector<int>> shard_groups() const;
  std::vector<std::vector<int>> replicate_groups() const;
};

}  // namespace crosstrain::parallel
