#include <gtest/gtest.h>

#include <set>

#include "crosstrain/core/error.h"
#include "crosstrain/parallel/mesh_shape.h"

using namespace crosstrain;
using parallel::Axis;
using parallel::MeshShape;

TEST(MeshShape, RankArithmeticRoundTrips) {
  MeshShape s{2, 3, 2};  // pp, dp, tp
  for (int r = 0; r < s.size(); ++r) EXPECT_EQ(s.rank_of(s.coords(r)), r);
  EXPECT_EQ(s.coords(1).tp, 1);  // tp is fastest
  EXPECT_EQ(s.coords(2).dp, 1);
  EXPECT_EQ(s.coords(6).pp, 1);
}

TEST(MeshShape, GroupsPartitionTheWorld) {
  MeshShape s{2, 2, 2};
  for (Axis axis : {Axis::PP, Axis::DP, Axis::TP}) {
    std::set<int> seen;
    auto groups = s.all_groups(axis);
    EXPECT_EQ(groups.size(), 4u);
    for (const auto& g : groups) {
      EXPECT_EQ(g.size(), 2u);
      for (int r : g) EXPECT_TRUE(seen.insert(r).second);
      // Members differ only along the axis.
      auto a = s.coords(g[0]), b = s.coords(g[1]);
      for (Axis other : {Axis::PP, Axis::DP, Axis::TP}) {
        if (other != axis) {
          EXPECT_EQ(a[other], b[other]);
        }
      }
    }
    EXPECT_EQ(seen.size(), 8u);
  }
  EXPECT_EQ(s.group(Axis::TP, 5), (std::vector<int>{4, 5}));
  EXPECT_EQ(s.group(Axis::DP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(s.group(Axis::PP, 5), (std::vector<int>{1, 5}));
}

TEST(MeshShape, WrongProductPrintsEveryFactor) {
  try {
    MeshShape{2, 3, 2}.check(8);
    FAIL();
  } catch (const UsageError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("dp=3 x pp=2 x tp=2 = 12"), std::string::npos) << what;
    EXPECT_NE(what.find("8 ranks"), std::string::npos) << what;
  }
  EXPECT_NO_THROW((MeshShape{1, 8, 1}.check(8)));
}

TEST(MeshShape, HybridShardingSplitsTheDataParallelAxisIntoShardAndReplicateGroups) {
  MeshShape s{2, 4, 2, 2};  // pp=2, dp=4 as 2 copies x 2 shards, tp=2: 16 ranks
  EXPECT_EQ(s.shard_width(), 2);
  EXPECT_EQ(s.state_copies(), 2);
  const auto shards = s.shard_groups(), copies = s.replicate_groups();
  ASSERT_EQ(shards.size(), 8u);  // pp x tp x copies
  ASSERT_EQ(copies.size(), 8u);  // pp x tp x shards
  std::set<int> seen;
  for (const auto& g : shards) {
    ASSERT_EQ(g.size(), 2u);
    for (int r : g) EXPECT_TRUE(seen.insert(r).second);
    // Neighbouring data-parallel indices of one copy, the same pp and tp.
    const auto a = s.coords(g[0]), b = s.coords(g[1]);
    EXPECT_EQ(a.pp, b.pp);
    EXPECT_EQ(a.tp, b.tp);
    EXPECT_EQ(b.dp, a.dp + 1);
    EXPECT_EQ(a.dp / 2, b.dp / 2);
  }
  EXPECT_EQ(seen.size(), 16u);
  for (const auto& g : copies) {
    ASSERT_EQ(g.size(), 2u);
    const auto a = s.coords(g[0]), b = s.coords(g[1]);
    EXPECT_EQ(a.dp % 2, b.dp % 2);  // the same shard of each copy
    EXPECT_EQ(b.dp, a.dp + 2);
  }
  // rank 5 is pp 0, dp 2, tp 1: shard 0 of copy 1.
  EXPECT_EQ(shards[3], (std::vector<int>{5, 7}));
  EXPECT_EQ(copies[1], (std::vector<int>{1, 5}));
  // dp_shard 0 (the default) is one copy over every data-parallel rank.
  MeshShape plain{1, 4, 1};
  EXPECT_EQ(plain.shard_groups(), (std::vector<std::vector<int>>{{0, 1, 2, 3}}));
  EXPECT_EQ(plain.state_copies(), 1);
}

TEST(MeshShape, AShardWidthThatDoesNotDivideTheDataParallelRanksIsAClearError) {
  try {
    MeshShape{1, 6, 1, 4}.check(6);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.dp_shard = 4 must divide the 6 data-parallel ranks"),
              std::string::npos) << e.what();
  }
  EXPECT_NO_THROW((MeshShape{1, 6, 1, 3}.check(6)));
}
