#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/comm/cost_model.h"
#include "crosstrain/core/error.h"

using namespace crosstrain;
using comm::algo::Algorithm;

TEST(CostModel, AlphaBetaFormulas) {
  comm::Link l{10e-6, 1e9};
  // Ring: 2(n-1) messages of S/n.
  EXPECT_NEAR(comm::predict_all_reduce(Algorithm::Ring, 4e6, 4, l), 6 * (10e-6 + 1e6 / 1e9), 1e-12);
  // Tree: 2 log2(n) messages of S.
  EXPECT_NEAR(comm::predict_all_reduce(Algorithm::Tree, 4e6, 4, l), 4 * (10e-6 + 4e6 / 1e9), 1e-12);
  // Halving-doubling: 2 log2(n) latencies and the ring's bytes.
  EXPECT_NEAR(comm::predict_all_reduce(Algorithm::HalvingDoubling, 4e6, 4, l), 4 * 10e-6 + 1.5 * 4e6 / 1e9, 1e-12);
  EXPECT_EQ(comm::predict_all_reduce(Algorithm::Ring, 4e6, 1, l), 0.0);
}

TEST(CostModel, ChoosesLatencyOptimalForSmallAndBandwidthOptimalForLarge) {
  auto t = comm::local_topology(8, comm::Link{50e-6, 2e9});
  EXPECT_EQ(comm::choose_all_reduce(64, t), Algorithm::HalvingDoubling);  // fewest latencies, power of two
  auto big = comm::choose_all_reduce(256e6, t);
  EXPECT_TRUE(big == Algorithm::Ring || big == Algorithm::HalvingDoubling);
  EXPECT_NE(big, Algorithm::Tree);
  // Across clusters joined by a slow link, keeping traffic local wins.
  comm::Topology two;
  two.hosts = {{"a", "east", 4}, {"b", "west", 4}};
  two.host = comm::Link{5e-6, 20e9};
  two.cluster = comm::Link{20e-6, 10e9};
  two.wan = comm::Link{25e-3, 12.5e6};
  EXPECT_EQ(comm::choose_all_reduce(64e6, two), Algorithm::Hierarchical);
  EXPECT_LT(comm::predict_hierarchical(64e6, two),
            comm::predict_all_reduce(Algorithm::Ring, 64e6, 8, two.bottleneck()));
}

TEST(Topology, ReadsTomlAndNamesErrors) {
  auto path = (std::filesystem::path(::testing::TempDir()) / "topo.toml").string();
  std::ofstream(path) << "[links.host]\nlatency_us = 5\nbandwidth_gbps = 80\n"
                         "[links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n"
                         "[links.wan]\nlatency_us = 25000\nbandwidth_gbps = 0.1\n"
                         "[[hosts]]\nname = \"a0\"\ncluster = \"east\"\nranks = 2\n"
                         "[[hosts]]\nname = \"b0\"\ncluster = \"west\"\nranks = 2\n";
  auto t = comm::load_topology(path);
  EXPECT_EQ(t.world_size(), 4);
  EXPECT_EQ(t.uniform_ranks_per_host(), 2);
  EXPECT_NEAR(t.wan.latency_s, 0.025, 1e-12);
  EXPECT_NEAR(t.wan.bandwidth_Bps, 0.1e9 / 8, 1e-3);
  EXPECT_EQ(&t.bottleneck(), &t.wan);
  std::ofstream(path) << "[links.host]\nlatency_us = 5\n";
  try {
    comm::load_topology(path);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("bandwidth_gbps"), std::string::npos) << e.what();
  }
}
