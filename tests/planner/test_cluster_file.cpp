// The planner's cluster file (planner/cluster.h): errors that name the file, the section and the key; the TOML
// written by to_toml reads back the same devices, clusters, links and curves; a plain topology file with
// [[hosts]] (comm/cost_model.h's format) becomes clusters.
#include <string>

#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/cluster.h"

namespace crosstrain::planner {
namespace {

std::string error_of(const std::string& text, const std::string& origin = "my-cluster.toml") {
  try {
    parse_cluster(text, origin);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

void expect_mentions(const std::string& message, std::initializer_list<const char*> parts) {
  EXPECT_FALSE(message.empty()) << "no error was thrown";
  for (const char* p : parts) EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' missing in: " << message;
}

const char* kCluster = "[[clusters]]\nname = \"c\"\ndevice = \"g\"\n";

TEST(ClusterFile, MissingPeakNamesFileSectionAndKey) {
  expect_mentions(error_of(std::string("[devices.g]\nmemory_gb = 80\n") + kCluster),
                  {"my-cluster.toml", "[devices.g]", "peak_tflops"});
  expect_mentions(error_of(std::string("[devices.g]\npeak_tflops = { bf16 = 100 }\n") + kCluster),
                  {"my-cluster.toml", "[devices.g]", "memory_gb"});
  expect_mentions(error_of(std::string("[devices.g]\npeak_tflops = { bf16 = -1 }\nmemory_gb = 8\n") + kCluster),
                  {"my-cluster.toml", "peak_tflops.bf16"});
  expect_mentions(error_of(std::string("[devices.g]\npeak_tflops = { bf16 = 1 }\nmemory_gb = 8\n"
                                       "gemm_efficiency = 1.5\n") + kCluster),
                  {"my-cluster.toml", "[devices.g]", "gemm_efficiency"});
  expect_mentions(error_of("name = [\n"), {"my-cluster.toml", "not valid TOML"});
  expect_mentions(error_of("name = \"empty\"\n"), {"my-cluster.toml", "[[clusters]]"});
}

TEST(ClusterFile, UnknownDeviceNameNamesFileAndDevice) {
  // cluster.h: parse_cluster "throws UsageError naming the file, the section and the key".
  // EXPECTED TO FAIL while parse_cluster checks the clusters' devices with ClusterFile::device_of, whose message
  // names the cluster and the device but not the file.
  const std::string message = error_of("[devices.g]\npeak_tflops = { bf16 = 1 }\nmemory_gb = 8\n"
                                       "[[clusters]]\nname = \"c\"\ndevice = \"h100\"\n");
  expect_mentions(message, {"h100", "'c'"});
  EXPECT_NE(message.find("my-cluster.toml"), std::string::npos) << message;
}

TEST(ClusterFile, WanNamingAnUnknownClusterIsAnError) {
  const std::string text = std::string("[devices.g]\npeak_tflops = { bf16 = 1 }\nmemory_gb = 8\n") + kCluster +
                           "[[wan]]\nclusters = [\"c\", \"mars\"]\nlatency_us = 1\nbandwidth_gbps = 1\n";
  expect_mentions(error_of(text), {"my-cluster.toml", "[[wan]] #1", "'mars'"});
  expect_mentions(error_of(std::string("[devices.g]\npeak_tflops = { bf16 = 1 }\nmemory_gb = 8\n") + kCluster +
                           "[[wan]]\nclusters = \"c\"\n"),
                  {"my-cluster.toml", "[[wan]] #1", "clusters"});
}

TEST(ClusterFile, UnitsAreConvertedOnRead) {
  const ClusterFile c = parse_cluster(
      "name = \"u\"\n"
      "[devices.g]\npeak_tflops = { fp32 = 19.5, bf16 = 312 }\nmemory_gb = 80\nmemory_bandwidth_gbs = 2039\n"
      "kernel_overhead_us = 5\nprice_per_hour = 2\n"
      "[[clusters]]\nname = \"c\"\ndevice = \"g\"\nhosts = 3\ndevices_per_host = 8\n"
      "[clusters.links.host]\nlatency_us = 3\nbandwidth_gbps = 1840\n"
      "[clusters.links.cluster]\nlatency_us = 6\nbandwidth_gbps = 200\n",
      "u.toml");
  const DeviceType& g = c.devices.at("g");
  EXPECT_DOUBLE_EQ(g.peak("bf16"), 312e12);
  EXPECT_DOUBLE_EQ(g.peak("fp16"), 19.5e12);  // no fp16: falls back to fp32 (bf16 only falls back to fp16)
  EXPECT_DOUBLE_EQ(g.memory_bytes, 80e9);
  EXPECT_DOUBLE_EQ(g.memory_bandwidth_Bps, 2039e9);
  EXPECT_DOUBLE_EQ(g.kernel_overhead_s, 5e-6);
  EXPECT_DOUBLE_EQ(g.gemm_rate(1e9, "bf16"), 312e12 * 0.7);  // the default efficiency without a curve
  EXPECT_EQ(c.total_devices(), 24);
  // Gbit/s to bytes/s: 1840e9 / 8 = 230e9; 200e9 / 8 = 25e9.
  EXPECT_DOUBLE_EQ(c.clusters[0].host_link.bandwidth_Bps, 230e9);
  EXPECT_DOUBLE_EQ(c.clusters[0].host_link.latency_s, 3e-6);
  EXPECT_DOUBLE_EQ(c.clusters[0].cluster_link.bandwidth_Bps, 25e9);
  EXPECT_DOUBLE_EQ(c.price_per_device_hour(c.clusters[0]), 2.0);
}

TEST(ClusterFile, GemmCurveInterpolatesOnLogFlops) {
  // Points (1 GFLOP, 10 TFLOP/s) and (100 GFLOP, 30 TFLOP/s): at 10 GFLOP, half-way in log, 20 TFLOP/s; below
  // the first and above the last point the end values.
  const ClusterFile c = parse_cluster("[devices.g]\npeak_tflops = { fp32 = 50 }\nmemory_gb = 8\n"
                                      "gemm_curve = { fp32 = [[100, 30], [1, 10]] }\n"
                                      "[[clusters]]\ndevice = \"g\"\n",
                                      "curve.toml");
  const DeviceType& g = c.devices.at("g");
  EXPECT_NEAR(g.gemm_rate(10e9, "fp32"), 20e12, 1e3);
  EXPECT_DOUBLE_EQ(g.gemm_rate(1e6, "fp32"), 10e12);
  EXPECT_DOUBLE_EQ(g.gemm_rate(1e15, "fp32"), 30e12);
}

TEST(ClusterFile, ToTomlReadsBackTheSame) {
  const std::string text =
      "name = \"round\"\n"
      "[devices.g]\npeak_tflops = { fp32 = 19.5, bf16 = 312 }\nmemory_gb = 80\nmemory_bandwidth_gbs = 2039\n"
      "power_w = 400\ngemm_efficiency = 0.6\nkernel_overhead_us = 4\ncomm_overlap = 0.5\nprice_per_hour = 2\n"
      "gemm_curve = { bf16 = [[1, 100], [64, 250]] }\n"
      "[devices.k]\npeak_tflops = { fp32 = 2 }\nmemory_gb = 16\n"
      "[[clusters]]\nname = \"east\"\ndevice = \"g\"\nhosts = 2\ndevices_per_host = 8\nprice_per_device_hour = 3\n"
      "[clusters.links.host]\nlatency_us = 3\nbandwidth_gbps = 1840\n"
      "[clusters.links.cluster]\nlatency_us = 6\nbandwidth_gbps = 200\nreduce_gbps = 800\n"
      "one_way_curve = [[4, 1e-5], [1048576, 2e-4]]\n"
      "[[clusters]]\nname = \"west\"\ndevice = \"k\"\nhosts = 4\ndevices_per_host = 2\ncompute_slots_per_host = 1\n"
      "[links.wan]\nlatency_us = 30000\nbandwidth_gbps = 10\n"
      "[[wan]]\nclusters = [\"east\", \"west\"]\nlatency_us = 40000\nbandwidth_gbps = 1\n";
  const ClusterFile a = parse_cluster(text, "round.toml");
  const ClusterFile b = parse_cluster(to_toml(a), "written.toml");
  EXPECT_EQ(b.name, "round");
  ASSERT_EQ(b.devices.size(), a.devices.size());
  for (const auto& [name, d] : a.devices) {
    SCOPED_TRACE(name);
    const DeviceType& e = b.devices.at(name);
    EXPECT_EQ(e.peak_flops, d.peak_flops);
    EXPECT_DOUBLE_EQ(e.memory_bytes, d.memory_bytes);
    EXPECT_DOUBLE_EQ(e.memory_bandwidth_Bps, d.memory_bandwidth_Bps);
    EXPECT_DOUBLE_EQ(e.power_w, d.power_w);
    EXPECT_DOUBLE_EQ(e.gemm_efficiency, d.gemm_efficiency);
    EXPECT_DOUBLE_EQ(e.kernel_overhead_s, d.kernel_overhead_s);
    EXPECT_DOUBLE_EQ(e.comm_overlap, d.comm_overlap);
    EXPECT_DOUBLE_EQ(e.price_per_hour, d.price_per_hour);
    ASSERT_EQ(e.gemm_curve.size(), d.gemm_curve.size());
    for (const auto& [dtype, points] : d.gemm_curve) {
      ASSERT_EQ(e.gemm_curve.at(dtype).size(), points.size());
      for (size_t i = 0; i < points.size(); ++i) {
        EXPECT_DOUBLE_EQ(e.gemm_curve.at(dtype)[i].flops, points[i].flops);
        EXPECT_DOUBLE_EQ(e.gemm_curve.at(dtype)[i].flops_per_s, points[i].flops_per_s);
      }
    }
  }
  EXPECT_EQ(a.devices.at("g").gemm_curve.at("bf16").size(), 2u);
  ASSERT_EQ(b.clusters.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ClusterSpec &x = a.clusters[i], &y = b.clusters[i];
    EXPECT_EQ(y.name, x.name);
    EXPECT_EQ(y.device, x.device);
    EXPECT_EQ(y.hosts, x.hosts);
    EXPECT_EQ(y.devices_per_host, x.devices_per_host);
    EXPECT_EQ(y.compute_slots_per_host, x.compute_slots_per_host);
    EXPECT_DOUBLE_EQ(y.price_per_device_hour, x.price_per_device_hour);
    for (auto [l, m] : {std::pair{&x.host_link, &y.host_link}, std::pair{&x.cluster_link, &y.cluster_link}}) {
      EXPECT_DOUBLE_EQ(m->latency_s, l->latency_s);
      EXPECT_DOUBLE_EQ(m->bandwidth_Bps, l->bandwidth_Bps);
      EXPECT_DOUBLE_EQ(m->reduce_Bps, l->reduce_Bps);
      ASSERT_EQ(m->one_way_curve.size(), l->one_way_curve.size());
      for (size_t k = 0; k < l->one_way_curve.size(); ++k) {
        EXPECT_DOUBLE_EQ(m->one_way_curve[k].bytes, l->one_way_curve[k].bytes);
        EXPECT_DOUBLE_EQ(m->one_way_curve[k].seconds, l->one_way_curve[k].seconds);
      }
    }
  }
  EXPECT_EQ(a.clusters[0].cluster_link.one_way_curve.size(), 2u);
  EXPECT_EQ(b.clusters[1].compute_slots_per_host, 1);
  EXPECT_DOUBLE_EQ(b.price_per_device_hour(b.clusters[0]), 3.0);
  EXPECT_DOUBLE_EQ(b.wan.bandwidth_Bps, 10e9 / 8);
  ASSERT_EQ(b.wan_links.size(), 1u);
  EXPECT_EQ(b.wan_links[0].a, "east");
  EXPECT_EQ(b.wan_links[0].b, "west");
  EXPECT_DOUBLE_EQ(b.wan_between("west", "east").bandwidth_Bps, 1e9 / 8);
  EXPECT_DOUBLE_EQ(b.wan_between("west", "east").latency_s, 40e-3);
}

TEST(ClusterFile, TopologyHostsBecomeClusters) {
  // comm/cost_model.h's topology format: three links and [[hosts]] with a cluster name, ranks and cores.
  const ClusterFile c = parse_cluster(
      "[links.host]\nlatency_us = 5\nbandwidth_gbps = 40\n"
      "[links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n"
      "[links.wan]\nlatency_us = 25000\nbandwidth_gbps = 0.1\n"
      "[[hosts]]\nname = \"a0\"\ncluster = \"east\"\nranks = 2\ncores = 16\n"
      "[[hosts]]\nname = \"a1\"\ncluster = \"east\"\nranks = 2\ncores = 16\n"
      "[[hosts]]\nname = \"b0\"\ncluster = \"west\"\nranks = 4\n",
      "topology.toml");
  ASSERT_EQ(c.clusters.size(), 2u);
  EXPECT_EQ(c.clusters[0].name, "east");
  EXPECT_EQ(c.clusters[0].hosts, 2);
  EXPECT_EQ(c.clusters[0].devices_per_host, 2);
  EXPECT_EQ(c.clusters[0].compute_slots_per_host, 16);
  EXPECT_EQ(c.clusters[1].name, "west");
  EXPECT_EQ(c.clusters[1].hosts, 1);
  EXPECT_EQ(c.clusters[1].devices_per_host, 4);
  EXPECT_EQ(c.total_devices(), 8);
  // No device named: a CPU core.
  EXPECT_EQ(c.clusters[0].device, "cpu");
  EXPECT_NO_THROW(c.device_of(c.clusters[0]));
  // 40 Gbit/s = 5e9 B/s inside a host, 10 Gbit/s = 1.25e9 between hosts, 0.1 Gbit/s = 12.5e6 between clusters.
  EXPECT_DOUBLE_EQ(c.clusters[0].host_link.bandwidth_Bps, 5e9);
  EXPECT_DOUBLE_EQ(c.clusters[0].host_link.latency_s, 5e-6);
  EXPECT_DOUBLE_EQ(c.clusters[1].cluster_link.bandwidth_Bps, 1.25e9);
  EXPECT_DOUBLE_EQ(c.wan_between("east", "west").bandwidth_Bps, 12.5e6);
  EXPECT_DOUBLE_EQ(c.wan_between("east", "west").latency_s, 25e-3);
  // Hosts of one cluster with different rank counts cannot be one cluster spec.
  expect_mentions(error_of("[[hosts]]\ncluster = \"e\"\nranks = 2\n[[hosts]]\ncluster = \"e\"\nranks = 3\n"),
                  {"my-cluster.toml", "[[hosts]] #2", "same ranks"});
}

}  // namespace
}  // namespace crosstrain::planner
