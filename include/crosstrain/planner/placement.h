// Where each rank of a layout runs, and which link two places talk over. Pure.
//
// Ranks fill the cluster file's devices in order (clusters in file order, hosts in order, devices in order), and
// the mesh numbers ranks as parallel/mesh_shape.h does (tp fastest, then dp, then pp), so a tensor-parallel group
// shares a host whenever tp <= devices_per_host and pipeline stages are the farthest apart (across clusters first).
#pragma once

#include <vector>

#include "crosstrain/comm/cost_model.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/planner/estimate.h"

namespace crosstrain::planner {

class DeviceMap {
 public:
  // `used`: how many devices the layout takes (the first `used` of the file). Throws UsageError when the file
  // has fewer.
  DeviceMap(const ClusterFile& cluster, int used);

  Placement place(int rank) const;
  const ClusterSpec& cluster_of(int rank) const { return cluster_->clusters[place(rank).cluster]; }
  const DeviceType& device_of(int rank) const { return *device_[place(rank).cluster]; }
  // Compute slow-down of a rank from sharing its host's compute slots (CPU cores) with other ranks: >= 1.
  double slowdown(int rank) const;
  // How busy the rank's host's other compute slots are: 0 alone, 1 when every slot has a rank (CPU hosts; 0 for
  // accelerators). The device's contention factor applies in proportion.
  double busy_fraction(int rank) const;
  // The link between two ranks: the host link inside a host, the cluster link inside a cluster, else the
  // wide-area link between their clusters.
  const comm::Link& link(int a, int b) const;
  // A group of n ranks first, first + stride, ...: the slowest link a collective over it crosses, how many
  // clusters it spans, and the link inside the first cluster it touches (for hierarchical and DiLoCo).
  struct GroupSpan {
    const comm::Link* bottleneck;
    const comm::Link* inside_cluster;  // between the group's members of one cluster
    int clusters = 1;
    int per_cluster = 1;               // members in the first cluster
  };
  GroupSpan span(int first, int stride, int n) const;
  int used() const { return used_; }

 private:
  const ClusterFile* cluster_;
  int used_;
  std::vector<int> first_device_;  // [cluster]: global index of its first device
  std::vector<const DeviceType*> device_;  // [cluster]
};

}  // namespace crosstrain::planner
