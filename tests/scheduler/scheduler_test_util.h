// Hand-built registries for the scheduler's tests.
#pragma once

#include <string>

#include "crosstrain/scheduler/registry.h"

namespace crosstrain::scheduler::testing {

inline planner::DeviceType a100() {
  planner::DeviceType d;
  d.name = "a100";
  d.peak_flops = {{"fp32", 19.5e12}, {"bf16", 312e12}};
  d.memory_bytes = 80e9;
  d.memory_bandwidth_Bps = 2e12;
  d.power_w = 400;
  d.gemm_efficiency = 0.6;
  d.price_per_hour = 2;
  return d;
}

inline planner::DeviceType h100() {
  planner::DeviceType d = a100();
  d.name = "h100";
  d.peak_flops = {{"fp32", 67e12}, {"bf16", 989e12}};
  d.price_per_hour = 4;
  return d;
}

inline comm::Link gbps_link(double gbps, double latency_s) {
  comm::Link l;
  l.bandwidth_Bps = gbps * 1e9 / 8;
  l.latency_s = latency_s;
  return l;
}

inline planner::ClusterSpec cluster(const std::string& name, const std::string& device, int hosts) {
  planner::ClusterSpec c;
  c.name = name;
  c.device = device;
  c.hosts = hosts;
  c.devices_per_host = 8;
  c.host_link = gbps_link(2400, 3e-6);
  c.cluster_link = gbps_link(400, 6e-6);
  return c;
}

// Two clusters of 64 A100 ("a", "b") joined by a wide-area link of `wan_gbps`.
inline Registry two_clusters(double wan_gbps) {
  Registry r;
  r.add_cluster(cluster("a", "a100", 8), a100());
  r.add_cluster(cluster("b", "a100", 8), a100());
  r.set_link("a", "b", gbps_link(wan_gbps, 0.03));
  return r;
}

}  // namespace crosstrain::scheduler::testing
