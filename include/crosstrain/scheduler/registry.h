// The resource layer of the compute network (ITU-T Y.2501): the clusters that offer devices, their speed, memory,
// price, power, free capacity and health, and the measured links between them. Built from a planner cluster file
// (planner/cluster.h), whose device types and links are the planner's cost model; the registry adds what changes
// while jobs run: free devices per cluster and whether a cluster is up.
//
//   Registry r = Registry::from_cluster_file(planner::load_cluster("clusters/three-clusters.toml"));
//   r.reserve({{"east", 32}, {"west", 32}});   // all or nothing
//   r.set_up("west", false);                   // lost: its devices are no longer offered
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "crosstrain/planner/cluster.h"

namespace crosstrain::scheduler {

// One cluster as the scheduler sees it (a summary of its planner spec plus its live state).
struct ClusterInfo {
  std::string name;
  std::string device;
  int devices = 0;
  int devices_per_host = 1;
  double peak_flops = 0;           // per device, bf16 (fp32 when the device gives no bf16)
  double memory_bytes = 0;         // per device
  double price_per_device_hour = 0;
  double power_w = 0;              // per device
  int free = 0;                    // devices not reserved by a job
  bool up = true;
};

class Registry {
 public:
  Registry() = default;
  // Every cluster of the file, all devices free and every cluster up. Throws UsageError for a file without clusters
  // or with two clusters of one name.
  static Registry from_cluster_file(planner::ClusterFile file);

  // Adds a cluster (its device type must be in the file or given here). Throws UsageError for a duplicate name.
  void add_cluster(const planner::ClusterSpec& spec, const planner::DeviceType& device);
  // Records a measured wide-area link between two registered clusters (replacing an earlier one).
  void set_link(const std::string& a, const std::string& b, const comm::Link& link);
  void set_default_link(const comm::Link& link) { file_.wan = link; }  // between clusters with no measured link

  int size() const { return static_cast<int>(file_.clusters.size()); }
  ClusterInfo info(int index) const;
  std::vector<ClusterInfo> clusters() const;
  int index_of(const std::string& name) const;  // throws UsageError naming the clusters for an unknown name
  const planner::ClusterFile& file() const { return file_; }
  const comm::Link& link(const std::string& a, const std::string& b) const { return file_.wan_between(a, b); }

  int free(int index) const { return free_[index]; }
  bool up(int index) const { return up_[index]; }
  int devices(int index) const { return file_.clusters[index].devices(); }
  int free_total() const;          // free devices of up clusters
  int capacity_total() const;      // every device of up clusters

  // Reserves every share or nothing: false (and no change) when a cluster is down or has too few free devices.
  bool reserve(const std::vector<std::pair<std::string, int>>& shares);
  // Gives reserved devices back. Throws Error when more would be free than the cluster has (a bookkeeping bug).
  void release(const std::vector<std::pair<std::string, int>>& shares);
  void set_up(const std::string& name, bool up);
  // The same clusters, every device free (what "could this job ever run here" is asked against).
  Registry all_free() const;

 private:
  planner::ClusterFile file_;
  std::vector<int> free_;
  std::vector<bool> up_;
};

}  // namespace crosstrain::scheduler
