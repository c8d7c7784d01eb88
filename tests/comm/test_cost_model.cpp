#include <gtest/gtest.h>

#include <cmath>
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

TEST(CostModel, EveryCollectiveHasAPrediction) {
  comm::Link l{10e-6, 1e9};
  using C = comm::Collective;
  const double S = 8e6;
  // Ring: reduce-scatter and all-gather are each half an all-reduce (n-1 exchange steps of S/n).
  EXPECT_NEAR(comm::predict(C::ReduceScatter, Algorithm::Ring, S, 4, l), 3 * (10e-6 + 2e6 / 1e9), 1e-12);
  EXPECT_NEAR(comm::predict(C::AllGather, Algorithm::Ring, S, 4, l), 3 * (10e-6 + 2e6 / 1e9), 1e-12);
  // Pipelined chain of 8 pieces: n - 2 + 8 messages of S/8.
  EXPECT_NEAR(comm::predict(C::Broadcast, Algorithm::Ring, S, 4, l), 10 * (10e-6 + 1e6 / 1e9), 1e-12);
  // Tree: log2 n levels of the whole buffer; scatter and gather move (n-1)/n of it through the root.
  EXPECT_NEAR(comm::predict(C::Broadcast, Algorithm::Tree, S, 4, l), 2 * (10e-6 + 8e6 / 1e9), 1e-12);
  EXPECT_NEAR(comm::predict(C::AllGather, Algorithm::Tree, S, 4, l),
              2 * 10e-6 + 0.75 * S / 1e9 + 2 * (10e-6 + 8e6 / 1e9), 1e-12);
  // Halving-doubling on a power of two: log2 p latencies and (p-1)/p of the bytes per phase.
  EXPECT_NEAR(comm::predict(C::ReduceScatter, Algorithm::HalvingDoubling, S, 4, l), 2 * 10e-6 + 0.75 * S / 1e9, 1e-12);
  EXPECT_NEAR(comm::predict(C::AllGather, Algorithm::HalvingDoubling, S, 4, l), 2 * 10e-6 + 0.75 * S / 1e9, 1e-12);
  // Other worlds fold the extra ranks in and out: dearer than the power of two below.
  for (auto op : {C::AllReduce, C::ReduceScatter, C::AllGather, C::Broadcast})
    EXPECT_GT(comm::predict(op, Algorithm::HalvingDoubling, S, 5, l),
              comm::predict(op, Algorithm::HalvingDoubling, S, 4, l)) << comm::to_string(op);
  // The reduction rate adds (n-1) combines of S/n to the ring all-reduce, and to the all-gather only the copy of
  // the rank's own slice (a copy costs what an add does).
  comm::Link g = l;
  g.reduce_Bps = 4e9;
  EXPECT_NEAR(comm::predict(C::AllReduce, Algorithm::Ring, S, 4, g) - comm::predict(C::AllReduce, Algorithm::Ring, S, 4, l),
              3 * 2e6 / 4e9, 1e-12);
  EXPECT_NEAR(comm::predict(C::AllGather, Algorithm::Ring, S, 4, g) - comm::predict(C::AllGather, Algorithm::Ring, S, 4, l),
              2e6 / 4e9, 1e-12);
  // Two ranks: the ring broadcast is one message (nothing to pipeline through); four ranks cut 8 MB into 8 pieces.
  EXPECT_NEAR(comm::predict(C::Broadcast, Algorithm::Ring, S, 2, l), 10e-6 + 8e6 / 1e9, 1e-12);
  EXPECT_EQ(comm::algo::ring_broadcast_segments(64 << 10, 4, 8), 1);
  EXPECT_EQ(comm::algo::ring_broadcast_segments(256 << 10, 4, 8), 4);
  EXPECT_EQ(comm::algo::ring_broadcast_segments(64 << 20, 2, 8), 1);
  EXPECT_TRUE(std::isinf(comm::predict(C::AllReduce, Algorithm::Builtin, S, 4, l)));
  for (auto op : {C::AllReduce, C::ReduceScatter, C::AllGather, C::Broadcast})
    for (auto a : {Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling})
      EXPECT_EQ(comm::predict(op, a, S, 1, l), 0.0);
}

TEST(CostModel, ChoosesPerOperation) {
  auto t = comm::local_topology(8, comm::Link{50e-6, 2e9});
  EXPECT_EQ(comm::choose_algorithm(comm::Collective::Broadcast, 64, t), Algorithm::Tree);  // log2 n messages
  EXPECT_NE(comm::choose_algorithm(comm::Collective::Broadcast, 256e6, t), Algorithm::Tree);
  EXPECT_NE(comm::choose_algorithm(comm::Collective::ReduceScatter, 256e6, t), Algorithm::Tree);
  EXPECT_EQ(comm::choose_algorithm(comm::Collective::AllGather, 64, t), Algorithm::HalvingDoubling);
  comm::Topology two;
  two.hosts = {{"a", "east", 4}, {"b", "west", 4}};
  two.host = comm::Link{5e-6, 20e9};
  two.cluster = comm::Link{20e-6, 10e9};
  two.wan = comm::Link{25e-3, 12.5e6};
  for (auto op : {comm::Collective::AllReduce, comm::Collective::ReduceScatter, comm::Collective::AllGather,
                  comm::Collective::Broadcast})
    EXPECT_EQ(comm::choose_algorithm(op, 64e6, two), Algorithm::Hierarchical) << comm::to_string(op);
}

TEST(CostModel, FitsAlphaAndBetaToMeasurements) {
  // Exact points of 40 us + bytes / 2 GB/s come back exactly.
  std::vector<comm::Sample> exact;
  for (double b : {4.0, 65536.0, 1048576.0, 8388608.0}) exact.push_back({b, 40e-6 + b / 2e9});
  auto l = comm::fit_link(exact);
  EXPECT_NEAR(l.latency_s, 40e-6, 1e-10);
  EXPECT_NEAR(l.bandwidth_Bps, 2e9, 1e3);
  // Relative errors weigh alike: 10% noise on the small message does not swing the bandwidth.
  exact[0].seconds *= 1.1;
  l = comm::fit_link(exact);
  EXPECT_NEAR(l.bandwidth_Bps, 2e9, 0.05 * 2e9);
  EXPECT_NEAR(l.latency_s, 40e-6, 5e-6);
  // Latency never comes out negative.
  l = comm::fit_link({{1000, 1e-6}, {1e6, 1.1e-3}});
  EXPECT_GE(l.latency_s, 0.0);
  EXPECT_GT(l.bandwidth_Bps, 0.0);
  EXPECT_THROW(comm::fit_link({{1000, 1e-3}, {1000, 2e-3}}), UsageError);
  EXPECT_THROW(comm::fit_link({{1000, 0.0}, {2000, 1e-3}}), UsageError);
}

TEST(Topology, DescribesTheLocalHost) {
  auto t = comm::describe_local_host("node7", 16, 4, comm::Link{5e-6, 10e9});
  ASSERT_EQ(t.hosts.size(), 1u);
  EXPECT_EQ(t.hosts[0].name, "node7");
  EXPECT_EQ(t.hosts[0].cores, 16);
  EXPECT_EQ(t.world_size(), 4);
  EXPECT_EQ(&t.bottleneck(), &t.host);
  EXPECT_EQ(t.host.latency_s, 5e-6);
  EXPECT_THROW(comm::describe_local_host("x", 1, 0, comm::Link{}), UsageError);

  auto here = comm::detect_local_topology(3);
  ASSERT_EQ(here.hosts.size(), 1u);
  EXPECT_EQ(here.hosts[0].name, comm::local_hostname());
  EXPECT_FALSE(here.hosts[0].name.empty());
  EXPECT_EQ(here.hosts[0].cores, comm::local_core_count());
  EXPECT_GE(here.hosts[0].cores, 1);
  EXPECT_EQ(here.world_size(), 3);
  const comm::Link d = comm::default_host_link();
  EXPECT_EQ(here.host.latency_s, d.latency_s);
  EXPECT_GT(d.bandwidth_Bps, 0.0);
}

TEST(Topology, WritesTomlThatReadsBack) {
  comm::Topology t;
  t.hosts = {{"a \"quoted\" host", "east", 2, 8}, {"b0", "west", 2, 0}};
  t.host = comm::Link{5e-6, 10e9};
  t.host.exchange_latency_s = 7e-6;
  t.host.exchange_bandwidth_Bps = 6e9;
  t.host.reduce_Bps = 20e9;
  t.cluster = comm::Link{20e-6, 1.25e9};
  t.wan = comm::Link{25e-3, 12.5e6};
  auto path = (std::filesystem::path(::testing::TempDir()) / "written.toml").string();
  std::ofstream(path) << comm::to_toml(t);
  auto back = comm::load_topology(path);
  ASSERT_EQ(back.hosts.size(), 2u);
  EXPECT_EQ(back.hosts[0].name, t.hosts[0].name);
  EXPECT_EQ(back.hosts[0].cores, 8);
  EXPECT_EQ(back.hosts[1].cluster, "west");
  EXPECT_NEAR(back.host.latency_s, 5e-6, 1e-15);
  EXPECT_NEAR(back.host.bandwidth_Bps, 10e9, 1e-3);
  EXPECT_NEAR(back.host.exchange_latency_s, 7e-6, 1e-15);
  EXPECT_NEAR(back.host.exchange_bandwidth_Bps, 6e9, 1e-3);
  EXPECT_NEAR(back.host.reduce_Bps, 20e9, 1e-3);
  EXPECT_EQ(back.cluster.exchange_latency_s, 0.0);
  EXPECT_NEAR(back.wan.latency_s, 25e-3, 1e-12);
  EXPECT_EQ(&back.bottleneck(), &back.wan);
}

TEST(CostModel, MeasuredCurvesReplaceTheStraightLines) {
  const std::vector<comm::Sample> curve{{4, 20e-6}, {1000, 30e-6}, {1e6, 1e-3}};
  EXPECT_DOUBLE_EQ(comm::interpolate(curve, 0), 20e-6);   // below the first point: its time
  EXPECT_DOUBLE_EQ(comm::interpolate(curve, 4), 20e-6);
  EXPECT_NEAR(comm::interpolate(curve, 502), 25e-6, 1e-15);  // linear between points
  EXPECT_NEAR(comm::interpolate(curve, 2e6), 1e-3 + (1e-3 - 30e-6) / (1e6 - 1000) * 1e6, 1e-12);  // last slope
  EXPECT_EQ(comm::interpolate({}, 5), 0.0);
  comm::Link l{10e-6, 1e9};
  const double straight = comm::predict_all_reduce(Algorithm::Ring, 2e6, 2, l);
  l.exchange_curve = curve;
  l.reduce_curve = {{0, 0}, {1e6, 0.5e-3}};
  // Ring on 2 ranks: two exchanges of 1 MB and one add of 1 MB, read off the curves.
  EXPECT_NEAR(comm::predict_all_reduce(Algorithm::Ring, 2e6, 2, l), 2 * 1e-3 + 0.5e-3, 1e-12);
  EXPECT_NE(comm::predict_all_reduce(Algorithm::Ring, 2e6, 2, l), straight);
  // The tree uses one-way messages: still the straight line until a one-way curve is set.
  EXPECT_NEAR(comm::predict_all_reduce(Algorithm::Tree, 2e6, 2, l), 2 * (10e-6 + 2e6 / 1e9) + 1e-3, 1e-12);
}

// The hierarchical algorithm's groups are consecutive ranks: hosts whose ranks interleave cannot use it.
TEST(CostModel, HierarchicalNeedsEachHostsRanksConsecutive) {
  comm::Topology t;
  t.hosts = {{"a", "x", 2, 0}, {"b", "x", 2, 0}};
  EXPECT_EQ(t.consecutive_ranks_per_host(), 2);  // no rank map (a file): counts only
  t.rank_host = {0, 0, 1, 1};
  EXPECT_EQ(t.consecutive_ranks_per_host(), 2);
  t.rank_host = {0, 1, 0, 1};  // round-robin placement
  EXPECT_EQ(t.consecutive_ranks_per_host(), 0);
  t.wan = t.cluster = comm::Link{1e-3, 1e8};
  t.host = comm::Link{1e-6, 1e10};
  EXPECT_NE(comm::choose_algorithm(comm::Collective::AllReduce, 64e6, t, /*hierarchical=*/false),
            Algorithm::Hierarchical);
}
