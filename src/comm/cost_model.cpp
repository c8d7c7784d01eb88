#include "crosstrain/comm/cost_model.h"

#include <toml++/toml.h>

#include <cmath>
#include <limits>

#include "crosstrain/core/error.h"

namespace crosstrain::comm {
namespace {

double log2_ceil(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n))); }

}  // namespace

int Topology::world_size() const {
  int n = 0;
  for (const auto& h : hosts) n += h.ranks;
  return n;
}

const Link& Topology::bottleneck() const {
  bool clusters = false, hosts_many = hosts.size() > 1;
  for (const auto& h : hosts)
    if (h.cluster != hosts.front().cluster) clusters = true;
  return clusters ? wan : hosts_many ? cluster : host;
}

int Topology::uniform_ranks_per_host() const {
  if (hosts.empty()) return 0;
  for (const auto& h : hosts)
    if (h.ranks != hosts.front().ranks) return 0;
  return hosts.front().ranks;
}

Topology local_topology(int ranks, Link local) {
  Topology t;
  t.hosts.push_back({"localhost", "local", ranks});
  t.host = t.cluster = t.wan = local;
  return t;
}

Topology load_topology(const std::string& path) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw UsageError("topology file '" + path + "': " + std::string(e.description()));
  }
  Topology t;
  auto link = [&](const char* name, Link& out) {
    auto* section = table["links"][name].as_table();
    if (!section) throw UsageError("topology file '" + path + "' has no [links." + name + "] section");
    auto latency = (*section)["latency_us"].value<double>();
    auto bandwidth = (*section)["bandwidth_gbps"].value<double>();
    if (!latency || !bandwidth || *bandwidth <= 0 || *latency < 0)
      throw UsageError("topology file '" + path + "': [links." + name +
                       "] needs latency_us >= 0 and bandwidth_gbps > 0 (numbers)");
    out.latency_s = *latency * 1e-6;
    out.bandwidth_Bps = *bandwidth * 1e9 / 8;
  };
  link("host", t.host);
  link("cluster", t.cluster);
  link("wan", t.wan);
  auto* hosts = table["hosts"].as_array();
  if (!hosts || hosts->empty()) throw UsageError("topology file '" + path + "' lists no [[hosts]]");
  for (auto& node : *hosts) {
    auto* h = node.as_table();
    if (!h) throw UsageError("topology file '" + path + "': every [[hosts]] entry must be a table");
    Topology::Host host;
    host.name = (*h)["name"].value_or(std::string("host") + std::to_string(t.hosts.size()));
    host.cluster = (*h)["cluster"].value_or(std::string("default"));
    host.ranks = static_cast<int>((*h)["ranks"].value_or(int64_t{1}));
    if (host.ranks < 1) throw UsageError("topology file '" + path + "': host " + host.name + " needs ranks >= 1");
    t.hosts.push_back(host);
  }
  return t;
}

double predict_all_reduce(algo::Algorithm a, double bytes, int n, const Link& l) {
  if (n <= 1) return 0.0;
  switch (a) {
    case algo::Algorithm::Ring:
      // 2(n-1) exchange steps (send right while receiving from the left), each moving a 1/n slice.
      return 2.0 * (n - 1) * l.exchange_seconds(bytes / n);
    case algo::Algorithm::Tree:
      // Reduce up and broadcast down a binomial tree: one-way messages of the whole buffer, 2 ceil(log2 n) levels.
      return 2.0 * log2_ceil(n) * l.seconds(bytes);
    case algo::Algorithm::HalvingDoubling: {
      int p = 1;
      while (p * 2 <= n) p *= 2;
      const double fold = p == n ? 0.0 : 2.0 * l.seconds(bytes);  // extra ranks in and out
      // 2 log2 p exchange steps; the halves shrink then grow: 2 (p-1)/p of the buffer in all.
      const double steps = 2.0 * std::log2(static_cast<double>(p));
      const double alpha = l.exchange_seconds(0.0);
      return fold + steps * alpha + (l.exchange_seconds(2.0 * (p - 1) / p * bytes) - alpha);
    }
    default:
      return std::numeric_limits<double>::infinity();
  }
}

double predict_hierarchical(double bytes, const Topology& t) {
  const int per_host = t.uniform_ranks_per_host();
  if (per_host == 0) return std::numeric_limits<double>::infinity();
  const int hosts = static_cast<int>(t.hosts.size());
  const double local = per_host > 1 ? 2.0 * log2_ceil(per_host) * t.host.seconds(bytes) : 0.0;
  const Link& across = t.bottleneck();
  return local + predict_all_reduce(algo::Algorithm::Ring, bytes, hosts, across);
}

algo::Algorithm choose_all_reduce(double bytes, const Topology& t) {
  const int n = t.world_size();
  algo::Algorithm best = algo::Algorithm::Ring;
  double best_time = std::numeric_limits<double>::infinity();
  for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling}) {
    const double s = predict_all_reduce(a, bytes, n, t.bottleneck());
    if (s < best_time) best = a, best_time = s;
  }
  if (t.hosts.size() > 1 && predict_hierarchical(bytes, t) < best_time) best = algo::Algorithm::Hierarchical;
  return best;
}

}  // namespace crosstrain::comm
