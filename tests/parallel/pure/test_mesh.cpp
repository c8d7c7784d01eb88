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
