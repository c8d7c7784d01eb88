// What calibration adds to a device and a cluster (compute_factor, the shared-memory all-reduce curve), DiLoCo's
// per-cluster batch, interleaved splits per rank, ZeRO-3's restriction, and `crosstrain sim`. Expected values are
// derived in the comments.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "subprocess.h"

#include "crosstrain/core/error.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/planner/estimate.h"
#include "crosstrain/planner/search.h"

namespace crosstrain::planner {
namespace {

// One host of 4 devices: 100 TFLOP/s fp32 at efficiency 0.5, no memory passes, no operator cost, so compute is
// exactly FLOPs / 50 TFLOP/s (times compute_factor).
std::string one_host(const std::string& device_extra, const std::string& cluster_extra) {
  return "[devices.x]\npeak_tflops = { fp32 = 100 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n" + device_extra +
         "\n[[clusters]]\nname = \"h\"\ndevice = \"x\"\nhosts = 1\ndevices_per_host = 4\n" + cluster_extra +
         "\n[clusters.links.host]\nlatency_us = 50\nbandwidth_gbps = 8\n";
}

Layout fp32(int dp, int tp) {
  Layout l;
  l.dp = dp, l.tp = tp, l.precision = "fp32", l.micro_batch = 2, l.microbatches = 1;
  return l;
}

TEST(PlannerCalibrated, ComputeFactorScalesComputationOnly) {
  const ModelShape m = model_preset("gpt-tiny");
  const Estimate plain = estimate(m, parse_cluster(one_host("", ""), "a.toml"), fp32(1, 1));
  const Estimate scaled = estimate(m, parse_cluster(one_host("compute_factor = { fp32 = 1.5 }", ""), "b.toml"), fp32(1, 1));
  // 1.5 x the computation; with no memory passes and no operators the optimizer costs nothing either way.
  EXPECT_NEAR(scaled.time.compute_s, 1.5 * plain.time.compute_s, 1e-12);
  EXPECT_NEAR(plain.time.optimizer_s, 0.0, 1e-15);
  // bf16 has no factor: unchanged.
  Layout bf = fp32(1, 1);
  bf.precision = "bf16";
  EXPECT_NEAR(estimate(m, parse_cluster(one_host("compute_factor = { fp32 = 1.5 }", ""), "b.toml"), bf).time.compute_s,
              estimate(m, parse_cluster(one_host("", ""), "a.toml"), bf).time.compute_s, 1e-12);
  EXPECT_THROW(parse_cluster(one_host("compute_factor = { fp32 = 0 }", ""), "bad.toml"), UsageError);
}

TEST(PlannerCalibrated, ContentionAppliesInProportionToTheBusyCores) {
  const ModelShape m = model_preset("gpt-tiny");
  // 4 devices on 3 compute slots, contention 1.6. One rank alone: 0 of the 2 other slots busy, no contention.
  // Two ranks: one of 2 others busy, 1 + 0.6 x 1/2 = 1.3. Three: 1.6. Four: 4/3 shared cores x 1.6.
  const ClusterFile c = parse_cluster(one_host("contention = { fp32 = 1.6 }", "compute_slots_per_host = 3"), "c.toml");
  const ClusterFile plain = parse_cluster(one_host("", "compute_slots_per_host = 3"), "p.toml");
  for (const auto& [dp, factor] : std::vector<std::pair<int, double>>{{1, 1.0}, {2, 1.3}, {3, 1.6}, {4, 4.0 / 3 * 1.6}}) {
    Layout l = fp32(dp, 1);
    // The computation of one replica, with and without the measured contention (plain still shares cores).
    const double with = estimate(m, c, l).time.compute_s;
    const double without = estimate(m, plain, l).time.compute_s;
    EXPECT_NEAR(with / without, dp == 4 ? 1.6 : factor, 1e-9) << "dp=" << dp;
    if (dp == 4) EXPECT_NEAR(without, estimate(m, plain, fp32(3, 1)).time.compute_s * 4.0 / 3, 1e-9);
  }
}

TEST(PlannerCalibrated, ZeroOneAllGathersTheUpdatedParameters) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host("", ""), "a.toml");
  Layout zero0 = fp32(2, 1), zero1 = fp32(2, 1);
  zero0.bucket_mb = zero1.bucket_mb = 100;  // one bucket: one all-reduce of the fp32 gradients
  zero1.zero = 1;
  // ZeRO-1 adds one all-gather of the fp32 parameters (875,264 x 4 bytes): over 2 ranks at least half of them
  // cross the 1 GB/s link, 1.75 ms.
  const double added = build_step_model(m, c, zero1).dp_sync_s[0] - build_step_model(m, c, zero0).dp_sync_s[0];
  EXPECT_GT(added, 875264.0 * 4 / 2 / 1e9);
}

TEST(PlannerCalibrated, SharedMemoryAllReduceCurveReplacesTheLinkInsideAHost) {
  const ModelShape m = model_preset("gpt-tiny");
  // gpt-tiny's gradients: 875,264 parameters x 4 bytes = 3,501,056 bytes; the curve says 1 ms at 1 MB and 3 ms at
  // 4 MB, so 3.5 MB take 1 + (3.501056 - 1) / 3 x 2 = 2.667 ms on 2 ranks (the curve was measured on 2).
  const std::string curve = "host_allreduce_curve = [[1000000.0, 0.001], [4000000.0, 0.003]]\nhost_allreduce_ranks = 2";
  const ClusterFile with = parse_cluster(one_host("", curve), "with.toml");
  Layout one_bucket = fp32(2, 1);
  one_bucket.bucket_mb = 100;
  const StepModel s = build_step_model(m, with, one_bucket);
  ASSERT_EQ(s.dp_sync_s.size(), 1u);
  EXPECT_NEAR(s.dp_sync_s[0], 0.001 + (3.501056e6 - 1e6) / 3e6 * 0.002, 1e-9);
  // On 4 ranks each writes once and reads 4 buffers: (1 + 4) / (1 + 2) of the 2-rank time.
  one_bucket.dp = 4;
  EXPECT_NEAR(build_step_model(m, with, one_bucket).dp_sync_s[0], s.dp_sync_s[0] * 5 / 3, 1e-9);
  // With the trainer's 1 MiB buckets: ceil(3,501,056 / 1,048,576) = 4 all-reduces of 875,264 bytes, each below
  // the curve's first point (1 ms): 4 ms.
  EXPECT_NEAR(build_step_model(m, with, fp32(2, 1)).dp_sync_s[0], 0.004, 1e-9);
  // Without the curve the point-to-point model applies: at 1 GB/s a ring moves 2 x 1/2 of 3.5 MB per rank,
  // about 3.5 ms plus latencies, so more than the curve's 2.67 ms.
  const ClusterFile without = parse_cluster(one_host("", ""), "without.toml");
  EXPECT_GT(build_step_model(m, without, fp32(2, 1)).dp_sync_s[0], 3.5e-3);
  // Round trip through the file.
  const ClusterFile back = parse_cluster(to_toml(with), "back.toml");
  ASSERT_EQ(back.clusters[0].host_allreduce_curve.size(), 2u);
  EXPECT_EQ(back.clusters[0].host_allreduce_ranks, 2);
  EXPECT_DOUBLE_EQ(back.clusters[0].host_allreduce_curve[1].seconds, 0.003);
}

// Two clusters of two devices, the second with half the peak, joined by a wide-area link.
ClusterFile two_speeds() {
  return parse_cluster(
      "[devices.fast]\npeak_tflops = { bf16 = 200 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n"
      "[devices.slow]\npeak_tflops = { bf16 = 100 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n"
      "[[clusters]]\nname = \"a\"\ndevice = \"fast\"\ndevices_per_host = 2\n"
      "[[clusters]]\nname = \"b\"\ndevice = \"slow\"\ndevices_per_host = 2\n"
      "[links.wan]\nlatency_us = 20000\nbandwidth_gbps = 1\n",
      "two.toml");
}

TEST(PlannerCalibrated, DilocoClusterBatchFollowsCapability) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = two_speeds();
  Layout even;
  even.dp = 4, even.micro_batch = 3, even.microbatches = 2, even.sync = LayoutSync::DiLoCo, even.inner_steps = 10;
  // Even: every replica runs 2 micro-batches of 3 sequences; the slow cluster (half the rate) sets the pace.
  const Estimate e = estimate(m, c, even);
  // 2:1 capability -> 16 and 8 sequences of 24, as the trainer splits them: 2 micro-batches of 4 on each fast
  // replica and of 2 on each slow one. Work is linear in sequences here (no passes, no operators), so the slow
  // cluster takes 2/3 of its even time, and the fast one 4/3 of its even time at twice the rate: the same.
  Layout split = even;
  split.cluster_batch = {16, 8};
  const Estimate s = estimate(m, c, split);
  EXPECT_NEAR(s.time.compute_s, e.time.compute_s * 2.0 / 3.0, 1e-9);
  EXPECT_LT(s.time.step_s, e.time.step_s);
  // The search offers the capability split itself for DiLoCo over different devices.
  SearchOptions o;
  o.global_batch = 24, o.micro_batches = {3}, o.threads = 1;
  bool offered = false;
  for (const Layout& l : enumerate_layouts(m, c, o))
    offered |= l.sync == LayoutSync::DiLoCo && l.dp == 4 && l.cluster_batch == std::vector<int64_t>{16, 8};
  EXPECT_TRUE(offered);
  // ... and the trainer takes it as sync.cluster_batch.
  const std::vector<std::string> sets = split.train_overrides();
  EXPECT_NE(std::find(sets.begin(), sets.end(), "sync.cluster_batch=\"16,8\""), sets.end());
  // Wrong sums, counts or modes are refused with the reason.
  Layout bad = split;
  bad.cluster_batch = {16, 4};
  EXPECT_THROW(estimate(m, c, bad), UsageError);
  bad.cluster_batch = {24};
  EXPECT_THROW(estimate(m, c, bad), UsageError);
  bad = split;
  bad.sync = LayoutSync::Sync;
  EXPECT_THROW(estimate(m, c, bad), UsageError);
}

TEST(PlannerCalibrated, InterleavedSplitBalancesEachRanksSum) {
  // gpt3-175b, 16 ranks x 4 chunks = 64 virtual stages for 96 blocks: each rank holds 6 blocks (2, 2, 1, 1 over
  // its chunks), never 8 on some and 4 on others.
  const ModelShape m = model_preset("gpt3-175b");
  const ClusterFile c = parse_cluster(
      "[devices.a]\npeak_tflops = { bf16 = 312 }\nmemory_gb = 80\n[[clusters]]\nname = \"s\"\ndevice = \"a\"\n"
      "hosts = 8\ndevices_per_host = 8\n",
      "a.toml");
  Layout l;
  l.tp = 4, l.pp = 16, l.dp = 1, l.chunks = 4, l.schedule = parallel::ScheduleKind::Interleaved1F1B;
  l.microbatches = 16;
  const Estimate e = estimate(m, c, l);
  ASSERT_EQ(e.layout.stage_layers.size(), 64u);
  for (int r = 0; r < 16; ++r) {
    int64_t sum = 0;
    for (int chunk = 0; chunk < 4; ++chunk) sum += e.layout.stage_layers[chunk * 16 + r];
    EXPECT_EQ(sum, 6) << "rank " << r;
  }
}

TEST(PlannerCalibrated, ZeroThreeNeedsOnePipelineStage) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host("", ""), "a.toml");
  Layout l = fp32(2, 1);
  l.zero = 3, l.pp = 2, l.dp = 2, l.microbatches = 2;
  EXPECT_THROW(estimate(m, c, l), UsageError);
  SearchOptions o;
  o.global_batch = 8, o.threads = 1;
  for (const Layout& x : enumerate_layouts(m, c, o)) EXPECT_FALSE(x.zero == 3 && x.pp > 1) << x.describe();
}

// The command's output (stdout and stderr) and its wait status; killed at the support library's deadline.
std::string run(const std::string& command, int* status) {
  const crosstrain::testing::ProcessResult r = crosstrain::testing::run_shell(command);
  *status = r.status;
  return r.output;
}

TEST(PlannerCli, ARecipesClusterBatchIsPlannedAsTheTrainerReadsIt) {
  const std::string dir = ::testing::TempDir() + "plan-cluster-batch";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  std::ofstream(dir + "/two.toml") << "[devices.x]\npeak_tflops = { fp32 = 1 }\nmemory_gb = 4\n"
                                      "[[clusters]]\nname = \"a\"\ndevice = \"x\"\n[[clusters]]\nname = \"b\"\ndevice = \"x\"\n";
  int status = 0;
  const std::string out = run(std::string(CROSSTRAIN_BINARY) + " plan " + CROSSTRAIN_SOURCE_DIR +
                                  "/recipes/gpt-tiny.toml " + dir + "/two.toml --nproc 2 --set sync.mode=diloco"
                                  " --set 'sync.cluster_batch=\"12,4\"' --json",
                              &status);
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(nlohmann::json::parse(out)["layout"].get<std::string>().find("cluster_batch=12,4"), std::string::npos) << out;
}

TEST(PlannerCli, SimReplaysTheStepAndWritesATrace) {
  const std::string trace = ::testing::TempDir() + "sim-trace.json";
  std::remove(trace.c_str());
  int status = 0;
  const std::string out = run(std::string(CROSSTRAIN_BINARY) + " sim gpt3-175b " + CROSSTRAIN_SOURCE_DIR +
                                  "/clusters/a100-1024.toml --layout \"tp=8 pp=16 m=32 mb=1 recompute=full\" --json"
                                  " --trace " + trace,
                              &status);
  ASSERT_EQ(status, 0) << out;
  const auto j = nlohmann::json::parse(out);
  // Same inputs, two methods: the replay and the closed form agree within a few percent on equal stages.
  EXPECT_NEAR(j["sim_step_s"].get<double>() / j["analytic_step_s"].get<double>(), 1.0, 0.05) << out;
  FILE* f = std::fopen(trace.c_str(), "r");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  // A preset without a layout cannot be replayed.
  run(std::string(CROSSTRAIN_BINARY) + " sim gpt3-175b " + CROSSTRAIN_SOURCE_DIR + "/clusters/a100-1024.toml", &status);
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace crosstrain::planner
