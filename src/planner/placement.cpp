#include "crosstrain/planner/placement.h"

#include <algorithm>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::planner {

DeviceMap::DeviceMap(const ClusterFile& cluster, int used) : cluster_(&cluster), used_(used) {
  int first = 0;
  for (const auto& c : cluster.clusters) {
    first_device_.push_back(first);
    device_.push_back(&cluster.device_of(c));
    first += c.devices();
  }
  if (used < 1 || used > first)
    throw UsageError("the layout needs " + std::to_string(used) + " devices; cluster file '" + cluster.name +
                     "' has " + std::to_string(first) + " (change dp x tp x pp, or add hosts)");
}

Placement DeviceMap::place(int rank) const {
  int c = static_cast<int>(first_device_.size()) - 1;
  while (c > 0 && first_device_[c] > rank) --c;
  const int local = rank - first_device_[c];
  return Placement{c, local / cluster_->clusters[c].devices_per_host};
}

double DeviceMap::slowdown(int rank) const {
  const Placement p = place(rank);
  const ClusterSpec& c = cluster_->clusters[p.cluster];
  if (c.compute_slots_per_host <= 0) return 1.0;
  const int host_first = first_device_[p.cluster] + p.host * c.devices_per_host;
  const int on_host = std::min(used_, host_first + c.devices_per_host) - host_first;
  return std::max(1.0, static_cast<double>(on_host) / c.compute_slots_per_host);
}

double DeviceMap::busy_fraction(int rank) const {
  const Placement p = place(rank);
  const ClusterSpec& c = cluster_->clusters[p.cluster];
  if (c.compute_slots_per_host <= 1) return 0.0;
  const int host_first = first_device_[p.cluster] + p.host * c.devices_per_host;
  const int on_host = std::min(used_, host_first + c.devices_per_host) - host_first;
  return std::min(1.0, static_cast<double>(on_host - 1) / (c.compute_slots_per_host - 1));
}

const comm::Link& DeviceMap::link(int a, int b) const {
  const Placement pa = place(a), pb = place(b);
  const ClusterSpec& ca = cluster_->clusters[pa.cluster];
  if (pa.cluster != pb.cluster) return cluster_->wan_between(ca.name, cluster_->clusters[pb.cluster].name);
  return pa.host == pb.host ? ca.host_link : ca.cluster_link;
}

DeviceMap::GroupSpan DeviceMap::span(int first, int stride, int n) const {
  const int last = first + (n - 1) * stride;
  const Placement a = place(first), b = place(last);
  GroupSpan g;
  g.clusters = b.cluster - a.cluster + 1;
  // Members in the first cluster: ranks below the next cluster's first device.
  const int cluster_end = a.cluster + 1 < static_cast<int>(first_device_.size()) ? first_device_[a.cluster + 1] : used_;
  g.per_cluster = std::min(n, (std::max(cluster_end - first, 1) + stride - 1) / stride);
  const int last_inside = first + (g.per_cluster - 1) * stride;
  g.inside_cluster = &link(first, last_inside);
  g.bottleneck = g.inside_cluster;
  for (int c = a.cluster + 1; c <= b.cluster; ++c) {
    const comm::Link& w = cluster_->wan_between(cluster_->clusters[a.cluster].name, cluster_->clusters[c].name);
    if (g.bottleneck == g.inside_cluster || w.bandwidth_Bps < g.bottleneck->bandwidth_Bps) g.bottleneck = &w;
  }
  return g;
}

}  // namespace crosstrain::planner
