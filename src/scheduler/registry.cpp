#include "crosstrain/scheduler/registry.h"

#include <algorithm>

#include "crosstrain/core/error.h"

namespace crosstrain::scheduler {

Registry Registry::from_cluster_file(planner::ClusterFile file) {
  if (file.clusters.empty()) throw UsageError("cluster file '" + file.name + "' has no clusters to offer");
  Registry r;
  std::vector<planner::ClusterSpec> clusters = std::move(file.clusters);
  file.clusters.clear();
  r.file_ = std::move(file);
  for (const auto& c : clusters) r.add_cluster(c, r.file_.device_of(c));
  return r;
}

void Registry::add_cluster(const planner::ClusterSpec& spec, const planner::DeviceType& device) {
  for (const auto& c : file_.clusters)
    if (c.name == spec.name) throw UsageError("cluster '" + spec.name + "' is registered twice; give each a new name");
  if (spec.devices() <= 0) throw UsageError("cluster '" + spec.name + "' offers no devices (hosts x devices_per_host)");
  file_.devices.emplace(device.name, device);  // keeps an existing type of that name
  planner::ClusterSpec c = spec;
  c.device = device.name;
  file_.clusters.push_back(c);
  free_.push_back(c.devices());
  up_.push_back(true);
}

void Registry::set_link(const std::string& a, const std::string& b, const comm::Link& link) {
  index_of(a), index_of(b);
  for (auto& w : file_.wan_links)
    if ((w.a == a && w.b == b) || (w.a == b && w.b == a)) {
      w.link = link;
      return;
    }
  file_.wan_links.push_back({a, b, link});
}

int Registry::index_of(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (file_.clusters[i].name == name) return i;
  std::string names;
  for (const auto& c : file_.clusters) names += (names.empty() ? "" : ", ") + c.name;
  throw UsageError("unknown cluster '" + name + "' (registered: " + names + ")");
}

ClusterInfo Registry::info(int index) const {
  const planner::ClusterSpec& c = file_.clusters[index];
  const planner::DeviceType& d = file_.device_of(c);
  ClusterInfo i;
  i.name = c.name;
  i.device = d.name;
  i.devices = c.devices();
  i.devices_per_host = c.devices_per_host;
  i.peak_flops = d.peak_flops.count("bf16") ? d.peak_flops.at("bf16") : d.peak("fp32");
  i.memory_bytes = d.memory_bytes;
  i.price_per_device_hour = file_.price_per_device_hour(c);
  i.power_w = d.power_w;
  i.free = free_[index];
  i.up = up_[index];
  return i;
}

std::vector<ClusterInfo> Registry::clusters() const {
  std::vector<ClusterInfo> out;
  for (int i = 0; i < size(); ++i) out.push_back(info(i));
  return out;
}

int Registry::free_total() const {
  int n = 0;
  for (int i = 0; i < size(); ++i)
    if (up_[i]) n += free_[i];
  return n;
}

int Registry::capacity_total() const {
  int n = 0;
  for (int i = 0; i < size(); ++i)
    if (up_[i]) n += devices(i);
  return n;
}

bool Registry::reserve(const std::vector<std::pair<std::string, int>>& shares) {
  // Check every share first (a cluster named twice counts twice), then apply: all or nothing.
  std::vector<int> want(size(), 0);
  for (const auto& [name, ranks] : shares) {
    if (ranks <= 0) throw Error("reserve: cluster '" + name + "' share of " + std::to_string(ranks) + " ranks");
    want[index_of(name)] += ranks;
  }
  for (int i = 0; i < size(); ++i)
    if (want[i] > 0 && (!up_[i] || want[i] > free_[i])) return false;
  for (int i = 0; i < size(); ++i) free_[i] -= want[i];
  return true;
}

void Registry::release(const std::vector<std::pair<std::string, int>>& shares) {
  for (const auto& [name, ranks] : shares) {
    const int i = index_of(name);
    if (free_[i] + ranks > devices(i))
      throw Error("release: cluster '" + name + "' would have " + std::to_string(free_[i] + ranks) + " free of " +
                  std::to_string(devices(i)) + " devices (released twice?)");
    free_[i] += ranks;
  }
}

void Registry::set_up(const std::string& name, bool up) { up_[index_of(name)] = up; }

Registry Registry::all_free() const {
  Registry r = *this;
  for (int i = 0; i < size(); ++i) r.free_[i] = devices(i);
  return r;
}

}  // namespace crosstrain::scheduler
