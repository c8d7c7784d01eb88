// Placement against hand-worked cases: where a job goes, in which sync mode, and why one is refused.
#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/placement.h"
#include "scheduler_test_util.h"

namespace crosstrain::scheduler {
namespace {

using testing::two_clusters;

JobSpec job(const std::string& model, int ranks, int64_t steps = 1000) {
  JobSpec j;
  j.name = model;
  j.model = planner::model_preset(model);
  j.ranks = ranks;
  j.global_batch = 768;  // divisible by every dp of 8..96 ranks
  j.steps = steps;
  return j;
}

JobProgress fresh(const JobSpec& j) {
  JobProgress p;
  p.steps_left = j.steps;
  if (j.qos.deadline_s > 0) p.seconds_left = j.qos.deadline_s;
  if (j.qos.budget > 0) p.budget_left = j.qos.budget;
  return p;
}

TEST(Placement, OneClusterThatFitsRunsSyncThere) {
  const Registry r = two_clusters(1);
  const JobSpec j = job("gpt2-xl", 32);
  const Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  ASSERT_EQ(d.placement.shares.size(), 1u);
  EXPECT_EQ(d.placement.shares[0].ranks, 32);
  EXPECT_EQ(d.placement.sync, planner::LayoutSync::Sync);
  EXPECT_EQ(d.placement.wan_gbps, 0);
  EXPECT_GT(d.placement.step_s, 0);
  // The layout covers the ranks: dp x tp x pp = 32.
  const planner::Layout l = planner::parse_layout(d.placement.layout);
  EXPECT_EQ(l.devices(), 32);
  // Cost = ranks x price x steps x step time, in hours.
  EXPECT_NEAR(d.placement.cost, 32 * 2.0 * 1000 * d.placement.step_s / 3600, 1e-6 * d.placement.cost);
}

// The placement's layout is what the ranks run (train_share passes every choice): the precision the device runs
// faster, and the largest micro-batch that fits (the fewest micro-batches; a pipeline takes at least its stages).
TEST(Placement, PicksThePrecisionTheDeviceRunsFasterAndTheLargestMicroBatchThatFits) {
  auto placed = [](const planner::DeviceType& device, const std::string& model, int ranks) {
    Registry r;
    r.add_cluster(testing::cluster("c", device.name, 1), device);
    JobSpec j = job(model, ranks);
    j.global_batch = 64;
    const Decision d = place(j, fresh(j), r);
    EXPECT_EQ(d.verdict, Verdict::Placed) << d.reason;
    return planner::parse_layout(d.placement.layout);
  };
  const planner::Layout gpu = placed(testing::a100(), "gpt2", 8);
  EXPECT_EQ(gpu.precision, "bf16") << "16x the fp32 rate";
  EXPECT_EQ(gpu.global_batch(), 64);
  planner::DeviceType cpu = testing::a100();
  cpu.name = "cpu";
  cpu.peak_flops = {{"fp32", 2e12}, {"bf16", 0.8e12}};  // no bf16 units: emulated, slower
  const planner::Layout slow_bf16 = placed(cpu, "gpt2", 8);
  EXPECT_EQ(slow_bf16.precision, "fp32");
  EXPECT_EQ(slow_bf16.pp, 1);
  EXPECT_EQ(slow_bf16.microbatches, 1) << "8 sequences per rank in one micro-batch: " << slow_bf16.describe();
  EXPECT_EQ(slow_bf16.micro_batch, 8);
}

TEST(Placement, PrefersTheFasterClusterAndBestFitOnTies) {
  Registry r;
  r.add_cluster(testing::cluster("slow", "a100", 8), testing::a100());
  r.add_cluster(testing::cluster("fast", "h100", 8), testing::h100());
  const JobSpec j = job("gpt2-xl", 16);
  Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  EXPECT_EQ(d.placement.shares[0].cluster, "fast");
  // Two equal clusters: the one with fewer free devices left after the job (best fit).
  Registry eq = two_clusters(1);
  ASSERT_TRUE(eq.reserve({{"b", 40}}));
  d = place(j, fresh(j), eq);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  EXPECT_EQ(d.placement.shares[0].cluster, "b");
}

// Every placement says, cluster by cluster, why it was or was not used.
TEST(Placement, EachClusterSaysWhyItWasOrWasNotUsed) {
  Registry r;
  r.add_cluster(testing::cluster("slow", "a100", 8), testing::a100());
  r.add_cluster(testing::cluster("fast", "h100", 8), testing::h100());
  r.add_cluster(testing::cluster("gone", "h100", 8), testing::h100());
  r.add_cluster(testing::cluster("busy", "h100", 8), testing::h100());
  r.set_up("gone", false);
  ASSERT_TRUE(r.reserve({{"busy", 64}}));
  const JobSpec j = job("gpt2-xl", 16);
  const Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  ASSERT_EQ(d.clusters.size(), 4u);
  EXPECT_EQ(d.clusters[0].rfind("slow: slower, ", 0), 0u) << d.clusters[0];
  EXPECT_EQ(d.clusters[1], "fast: used, 16 ranks");
  EXPECT_EQ(d.clusters[2], "gone: lost");
  EXPECT_EQ(d.clusters[3], "busy: full");
  // Spanning two of three equal clusters: the third is not needed.
  Registry three = two_clusters(1);
  three.add_cluster(testing::cluster("c", "a100", 8), testing::a100());
  ASSERT_TRUE(three.reserve({{"c", 60}}));
  const JobSpec big = job("gpt2-xl", 96);
  const Decision s = place(big, fresh(big), three);
  ASSERT_EQ(s.verdict, Verdict::Placed) << s.reason;
  ASSERT_EQ(s.clusters.size(), 3u);
  EXPECT_EQ(s.clusters[2].rfind("c: ", 0), 0u);
  EXPECT_EQ(s.clusters[2].find("used"), std::string::npos) << s.clusters[2];
}

TEST(Placement, SplitAcrossASlowLinkUsesDiLoCo) {
  // 96 ranks on two clusters of 64: no single cluster holds the job. GPT-2 XL's fp32 gradient is 6.2 GB; over
  // 1 Gbit/s a synchronous all-reduce takes tens of seconds per step, DiLoCo pays it once per 50 steps.
  const Registry r = two_clusters(1);
  const JobSpec j = job("gpt2-xl", 96);
  const Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  ASSERT_EQ(d.placement.shares.size(), 2u);
  EXPECT_EQ(d.placement.ranks(), 96);
  EXPECT_EQ(d.placement.sync, planner::LayoutSync::DiLoCo);
  EXPECT_EQ(d.placement.inner_steps, 50);
  EXPECT_GT(d.placement.wan_gbps, 0);
  const planner::Layout l = planner::parse_layout(d.placement.layout);
  for (const auto& s : d.placement.shares) EXPECT_EQ(s.ranks % l.tp, 0) << s.cluster;
}

TEST(Placement, SplitAcrossAFastLinkStaysSynchronous) {
  const Registry r = two_clusters(3200);
  const JobSpec j = job("gpt2-xl", 96);
  const Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  ASSERT_EQ(d.placement.shares.size(), 2u);
  EXPECT_NE(d.placement.sync, planner::LayoutSync::DiLoCo);
}

TEST(Placement, MaxWanBandwidthZeroForbidsASplit) {
  const Registry r = two_clusters(3200);
  JobSpec j = job("gpt2-xl", 96);
  j.qos.max_wan_gbps = 0;
  const Decision now = place(j, fresh(j), r);
  EXPECT_EQ(now.verdict, Verdict::NotNow);
  EXPECT_NE(now.reason.find("forbids spanning"), std::string::npos) << now.reason;
  // Both clusters empty and still no single one holds 96: it can never run.
  EXPECT_EQ(classify(j, fresh(j), r).verdict, Verdict::Never);
}

TEST(Placement, MaxWanBandwidthBelowEvenDiLoCoRefuses) {
  const Registry r = two_clusters(1);
  JobSpec j = job("gpt2-xl", 96);
  j.qos.max_wan_gbps = 1e-4;
  const Decision d = classify(j, fresh(j), r);
  EXPECT_EQ(d.verdict, Verdict::Never);
  EXPECT_NE(d.reason.find("Gbit/s"), std::string::npos) << d.reason;
  // A limit DiLoCo meets but synchronous training does not: DiLoCo even on a fast link.
  const Registry fast = two_clusters(3200);
  const Decision any = place(job("gpt2-xl", 96), fresh(job("gpt2-xl", 96)), fast);
  ASSERT_EQ(any.verdict, Verdict::Placed);
  j.qos.max_wan_gbps = any.placement.wan_gbps * 0.5;  // half what the synchronous choice needs
  const Decision limited = place(j, fresh(j), fast);
  ASSERT_EQ(limited.verdict, Verdict::Placed) << limited.reason;
  EXPECT_EQ(limited.placement.sync, planner::LayoutSync::DiLoCo);
  EXPECT_LE(limited.placement.wan_gbps, j.qos.max_wan_gbps);
}

TEST(Placement, BudgetAndDeadlineRefusals) {
  const Registry r = two_clusters(1);
  JobSpec j = job("gpt2-xl", 32, 100000);
  const Decision free_run = place(j, fresh(j), r);
  ASSERT_EQ(free_run.verdict, Verdict::Placed);
  j.qos.budget = free_run.placement.cost * 0.5;
  Decision d = classify(j, fresh(j), r);
  EXPECT_EQ(d.verdict, Verdict::Never);
  EXPECT_NE(d.reason.find("budget"), std::string::npos) << d.reason;
  j.qos.budget = free_run.placement.cost * 2;
  EXPECT_EQ(place(j, fresh(j), r).verdict, Verdict::Placed);

  JobSpec late = job("gpt2-xl", 32, 100000);
  late.qos.deadline_s = free_run.placement.step_s * 100000 * 0.5;
  d = classify(late, fresh(late), r);
  EXPECT_EQ(d.verdict, Verdict::Never);
  EXPECT_NE(d.reason.find("deadline"), std::string::npos) << d.reason;
}

TEST(Placement, BusyClustersMeanWaitNotReject) {
  Registry r = two_clusters(1);
  ASSERT_TRUE(r.reserve({{"a", 60}, {"b", 60}}));
  const JobSpec j = job("gpt2", 16);
  const Decision d = classify(j, fresh(j), r);
  EXPECT_EQ(d.verdict, Verdict::NotNow);
  EXPECT_NE(d.reason.find("8 free"), std::string::npos) << d.reason;
  // More ranks than every cluster together: never.
  EXPECT_EQ(classify(job("gpt2", 256), fresh(job("gpt2", 256)), r).verdict, Verdict::Never);
  // A lost cluster's devices are not offered.
  Registry down = two_clusters(1);
  down.set_up("a", false);
  const Decision d2 = place(job("gpt2", 96), fresh(job("gpt2", 96)), down);
  EXPECT_EQ(d2.verdict, Verdict::NotNow);
}

TEST(Placement, ReservationIsAllOrNothing) {
  Registry r = two_clusters(1);
  ASSERT_TRUE(r.reserve({{"a", 60}}));
  EXPECT_FALSE(r.reserve({{"b", 8}, {"a", 8}}));  // a has 4 free: nothing is taken from b either
  EXPECT_EQ(r.free(r.index_of("b")), 64);
  r.set_up("b", false);
  EXPECT_FALSE(r.reserve({{"b", 8}}));
  EXPECT_THROW(r.release({{"a", 61}}), Error);
  EXPECT_THROW(r.index_of("nowhere"), UsageError);
}

TEST(Placement, MemoisedLayoutsGiveTheSameDecision) {
  const Registry r = two_clusters(1);
  const JobSpec j = job("gpt2-xl", 96);
  LayoutCache cache;
  const Decision first = place(j, fresh(j), r, {}, &cache);
  const Decision second = place(j, fresh(j), r, {}, &cache);
  EXPECT_GT(first.estimates, 0);
  EXPECT_EQ(second.estimates, 0);
  EXPECT_EQ(first.placement.layout, second.placement.layout);
  EXPECT_EQ(first.placement.sync, second.placement.sync);
}

// An elastic gang (min_ranks) takes what is free, down to its minimum, keeping the global batch: after a cluster
// is lost it continues on the survivors instead of waiting for the lost one.
TEST(Placement, AnElasticGangPlacesOnFewerRanksDownToItsMinimum) {
  Registry r = two_clusters(1);
  JobSpec j = job("gpt2-xl", 96);
  j.min_ranks = 48;
  Decision d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  EXPECT_EQ(d.placement.ranks(), 96) << "all ranks while they are free";
  r.set_up("b", false);
  d = place(j, fresh(j), r);
  ASSERT_EQ(d.verdict, Verdict::Placed) << d.reason;
  EXPECT_EQ(d.placement.ranks(), 64) << "the most of 48..96 that fit one cluster of 64 and divide 768";
  ASSERT_EQ(d.placement.shares.size(), 1u);
  EXPECT_EQ(d.placement.shares[0].cluster, "a");
  ASSERT_TRUE(r.reserve({{"a", 20}}));  // 44 free: below the minimum
  EXPECT_EQ(place(j, fresh(j), r).verdict, Verdict::NotNow);
  j.min_ranks = 0;  // a fixed gang never shrinks
  r.release({{"a", 20}});
  EXPECT_EQ(place(j, fresh(j), r).verdict, Verdict::NotNow);
}

}  // namespace
}  // namespace crosstrain::scheduler
