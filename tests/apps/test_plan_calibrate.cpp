// `crosstrain plan --calibrate` (issue 16, item 3): the pure parts (the curve, /proc/meminfo, the description of a
// host) on made-up measurements, then one quick real calibration of this host read back through the cluster file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "crosstrain/core/error.h"
#include "plan_calibrate.h"

namespace crosstrain::apps {
namespace {

using planner::GemmPoint;

TEST(CalibrateCurve, SortsByFlopsAndMergesEqualFlopsIntoTheirMedianRate) {
  const auto curve = gemm_curve({{8, 3}, {2, 5}, {8, 1}, {8, 2}, {4, 7}});
  ASSERT_EQ(curve.size(), 3u);
  EXPECT_EQ(curve[0].flops, 2);
  EXPECT_EQ(curve[0].flops_per_s, 5);
  EXPECT_EQ(curve[1].flops, 4);
  EXPECT_EQ(curve[2].flops, 8);
  EXPECT_EQ(curve[2].flops_per_s, 2);  // the median of 3, 1, 2
  EXPECT_TRUE(gemm_curve({}).empty());
}

comm::Link measured_link(std::vector<double> one_way_seconds) {
  comm::Link l;
  const double sizes[] = {4, 1 << 10, 1 << 20, 4 << 20};
  for (size_t i = 0; i < one_way_seconds.size(); ++i) {
    l.one_way_curve.push_back({sizes[i], one_way_seconds[i]});
    l.exchange_curve.push_back({sizes[i], 2 * one_way_seconds[i]});
  }
  l.reduce_curve = {{0, 0}, {4 << 20, 1e-3}};
  return l;
}

TEST(CalibrateLink, MergesRunsByTheFastestPerSizeAndNeverLetsABiggerMessageBeFaster) {
  const comm::Link merged = merge_link_calibrations({measured_link({50e-6, 60e-6, 500e-6, 2e-3}),
                                                     measured_link({900e-6, 55e-6, 400e-6, 1.9e-3}),
                                                     measured_link({60e-6, 700e-6, 450e-6, 2.1e-3})});
  ASSERT_EQ(merged.one_way_curve.size(), 4u);
  EXPECT_EQ(merged.one_way_curve[0].seconds, 50e-6);   // the fastest of 50, 900, 60
  EXPECT_EQ(merged.one_way_curve[1].seconds, 55e-6);   // of 60, 55, 700
  EXPECT_EQ(merged.one_way_curve[2].seconds, 400e-6);
  EXPECT_EQ(merged.one_way_curve[3].seconds, 1.9e-3);
  EXPECT_EQ(merged.exchange_curve[0].seconds, 100e-6);
  // One run: a small message slower than a larger one is interference and takes the larger one's time.
  const comm::Link one = merge_link_calibrations({measured_link({300e-6, 60e-6, 500e-6, 2e-3})});
  EXPECT_EQ(one.one_way_curve[0].seconds, 60e-6);
  // The straight lines follow the merged curve: about 2e-3 s at 4 MiB.
  EXPECT_NEAR(one.latency_s + (4 << 20) / one.bandwidth_Bps, 2e-3, 0.5e-3);
  EXPECT_DOUBLE_EQ(one.reduce_Bps, (4 << 20) / 1e-3);
  EXPECT_THROW(merge_link_calibrations({}), UsageError);
  EXPECT_THROW(merge_link_calibrations({measured_link({1e-4, 2e-4, 3e-4, 4e-4}), measured_link({1e-4, 2e-4, 3e-4})}),
               UsageError);
}

TEST(CalibrateMeminfo, ReadsMemTotalInBytes) {
  EXPECT_EQ(parse_meminfo_total("MemFree:  100 kB\nMemTotal:       24683652 kB\nHugePages_Total: 0\n"),
            24683652.0 * 1024);
  EXPECT_EQ(parse_meminfo_total("MemFree: 100 kB\n"), 0);
}

HostMeasurements made_up_host() {
  HostMeasurements m;
  m.hostname = "box";
  m.cores = 3;
  m.total_memory_bytes = 12e9;
  m.gemm["fp32"] = {{1e6, 40e9}, {1e8, 90e9}, {1e6, 20e9}, {1e9, 80e9}};
  m.memory_bandwidth_Bps = 15e9;
  m.kernel_overhead_s = 3e-6;
  m.link.latency_s = 40e-6;
  m.link.bandwidth_Bps = 3e9;
  return m;
}

TEST(CalibrateDescribe, OneHostOfTwoRanksPerCoreSharingItsMemoryAndPower) {
  const planner::ClusterFile f = describe_host(made_up_host(), /*watts_per_core_assumed=*/10);
  ASSERT_EQ(f.clusters.size(), 1u);
  const planner::ClusterSpec& c = f.clusters[0];
  EXPECT_EQ(c.name, "box");
  EXPECT_EQ(c.hosts, 1);
  EXPECT_EQ(c.devices_per_host, 6);
  EXPECT_EQ(c.compute_slots_per_host, 3);
  EXPECT_EQ(c.host_link.latency_s, 40e-6);
  EXPECT_EQ(c.cluster_link.bandwidth_Bps, 3e9);
  EXPECT_EQ(f.wan.bandwidth_Bps, 3e9);
  const planner::DeviceType& d = f.device_of(c);
  EXPECT_DOUBLE_EQ(d.memory_bytes, 2e9);
  EXPECT_DOUBLE_EQ(d.power_w, 5.0);  // 10 W x 3 cores over 6 ranks
  EXPECT_EQ(d.peak_flops.at("fp32"), 90e9);
  ASSERT_EQ(d.gemm_curve.at("fp32").size(), 3u);
  EXPECT_EQ(d.gemm_curve.at("fp32")[0].flops_per_s, 30e9);  // the median of 40 and 20
  EXPECT_EQ(d.kernel_overhead_s, 3e-6);
  EXPECT_EQ(d.memory_bandwidth_Bps, 15e9);

  HostMeasurements rapl = made_up_host();
  rapl.host_power_w = 90;
  EXPECT_DOUBLE_EQ(describe_host(rapl).devices.at("cpu").power_w, 15.0);
}

TEST(CalibrateDescribe, RefusesADtypeWithoutPointsAndAHostWithoutCores) {
  HostMeasurements m = made_up_host();
  m.gemm["bf16"] = {};
  EXPECT_THROW(describe_host(m), UsageError);
  m = made_up_host();
  m.cores = 0;
  EXPECT_THROW(describe_host(m), UsageError);
}

void expect_close(double a, double b, const std::string& what) {
  EXPECT_LE(std::abs(a - b), 1e-6 * std::max(std::abs(a), std::abs(b))) << what << ": " << a << " vs " << b;
}

TEST(CalibrateThisHost, MeasuresPositiveAscendingCurvesAndTheFileReadsBack) {
  CalibrateOptions o;
  o.seconds_per_point = 0.01;
  o.shapes = {{128, 128, 128}, {32, 32, 32}, {64, 64, 64}, {16, 128, 128}};  // the last two: equal FLOPs
  o.bandwidth_bytes = 4 << 20;
  o.overhead_ops = 20;
  o.link.sizes = {4, 64 << 10};
  o.link.rounds = 5;
  o.link_repeats = 2;
  o.progress = false;
  const planner::ClusterFile f = calibrate_this_host(o);
  const planner::DeviceType& d = f.devices.at("cpu");
  for (const std::string dtype : {"fp32", "bf16"}) {
    const auto& curve = d.gemm_curve.at(dtype);
    ASSERT_EQ(curve.size(), 3u) << dtype;
    double best = 0;
    for (size_t i = 0; i < curve.size(); ++i) {
      EXPECT_GT(curve[i].flops_per_s, 0) << dtype;
      if (i > 0) EXPECT_GT(curve[i].flops, curve[i - 1].flops) << dtype;
      best = std::max(best, curve[i].flops_per_s);
    }
    EXPECT_GE(d.peak_flops.at(dtype), best) << dtype;  // the best point, before merging
  }
  EXPECT_GT(d.memory_bandwidth_Bps, 1e8);
  EXPECT_GT(d.kernel_overhead_s, 0);
  EXPECT_LT(d.kernel_overhead_s, 1e-3);
  const planner::ClusterSpec& c = f.clusters.at(0);
  EXPECT_EQ(c.compute_slots_per_host, comm::local_core_count());
  EXPECT_EQ(c.devices_per_host, 2 * comm::local_core_count());
  EXPECT_GT(c.host_link.latency_s, 0);
  EXPECT_EQ(c.host_link.one_way_curve.size(), 2u);  // measured, not the default link (which has no curves)

  const planner::ClusterFile back = planner::parse_cluster(planner::to_toml(f), "calibrated");
  ASSERT_EQ(back.clusters.size(), 1u);
  EXPECT_EQ(back.clusters[0].name, c.name);
  EXPECT_EQ(back.clusters[0].devices_per_host, c.devices_per_host);
  EXPECT_EQ(back.clusters[0].compute_slots_per_host, c.compute_slots_per_host);
  const planner::DeviceType& e = back.device_of(back.clusters[0]);
  for (const std::string dtype : {"fp32", "bf16"}) {
    expect_close(e.peak(dtype), d.peak(dtype), dtype + " peak");
    ASSERT_EQ(e.gemm_curve.at(dtype).size(), d.gemm_curve.at(dtype).size());
    for (size_t i = 0; i < d.gemm_curve.at(dtype).size(); ++i) {
      expect_close(e.gemm_curve.at(dtype)[i].flops, d.gemm_curve.at(dtype)[i].flops, dtype + " curve flops");
      expect_close(e.gemm_curve.at(dtype)[i].flops_per_s, d.gemm_curve.at(dtype)[i].flops_per_s, dtype + " curve rate");
    }
  }
  expect_close(e.memory_bandwidth_Bps, d.memory_bandwidth_Bps, "memory bandwidth");
  expect_close(e.kernel_overhead_s, d.kernel_overhead_s, "kernel overhead");
  expect_close(e.memory_bytes, d.memory_bytes, "memory");
  expect_close(e.power_w, d.power_w, "power");
  expect_close(back.clusters[0].host_link.seconds(1 << 20), c.host_link.seconds(1 << 20), "host link at 1 MiB");
  expect_close(back.wan.seconds(1 << 20), f.wan.seconds(1 << 20), "wan placeholder at 1 MiB");

  // The all-reduce a same-host run takes, in both dtypes: one point per size, the time growing with the bytes.
  for (const auto* curve : {&c.host_allreduce_curve, &c.host_allreduce_bf16_curve}) {
    ASSERT_EQ(curve->size(), 7u);
    EXPECT_GT(curve->front().seconds, 0);
    EXPECT_GT(curve->back().seconds, curve->front().seconds);
    EXPECT_GT(curve->back().bytes, curve->front().bytes);
  }
  EXPECT_EQ(back.clusters[0].host_allreduce_curve.size(), 7u);
  EXPECT_EQ(back.clusters[0].host_allreduce_bf16_curve.size(), 7u);
  // The reference model's factors, measured (not the default 1) and read back; communication never hidden.
  for (const std::string dtype : {"fp32", "bf16"}) {
    ASSERT_TRUE(d.compute_factor.count(dtype)) << dtype;
    EXPECT_GT(d.compute_factor.at(dtype), 0.1) << dtype;
    EXPECT_LT(d.compute_factor.at(dtype), 20) << dtype;
    ASSERT_TRUE(d.contention.count(dtype)) << dtype;
    EXPECT_GE(d.contention.at(dtype), 1.0) << dtype;
    expect_close(e.factor(dtype), d.factor(dtype), dtype + " compute factor");
  }
  EXPECT_EQ(d.comm_overlap, 0.0);
  EXPECT_EQ(e.comm_overlap, 0.0);
}

}  // namespace
}  // namespace crosstrain::apps
