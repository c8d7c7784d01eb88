// Choosing a sync mode (crosstrain/sync/strategy.h): the cluster of each data-parallel rank and the groups built
// from it (build_groups, cluster_layout, the topology and environment look-ups), the checks of [sync]
// (check_sync_config), and make_sync_strategy, which builds the groups and calls the chosen mode's factory
// (modes.h). Each mode's class lives in its own file: sync_every_step.cpp, diloco.cpp, server_sync.cpp and
// gossip.cpp, on the shared base in strategy_base.h.
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/sync_mode.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <unistd.h>

#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/core/error.h"
#include "modes.h"
#include "strategy_base.h"

namespace crosstrain::train {
using namespace sync_detail;

namespace {

// `split`: also create the local and cross groups (modes that average inside and across clusters).
ClusterGroups build_groups(const SyncSetup& s, bool split) {
  ClusterGroups g;
  std::vector<int> ids;
  const bool plain = sync_traits(s.config).mode == SyncMode::Sync && !s.config.hierarchical;
  if (plain) {
    ids.assign(s.dp_size, 0);  // plain sync: nothing depends on clusters, so nothing is exchanged
  } else if (!s.config.cluster_ranks.empty()) {
    ids = sized_clusters(s.dp_size, parse_cluster_ranks(s.config.cluster_ranks));
  } else if (s.config.clusters > 0) {
    ids = block_clusters(s.dp_size, static_cast<int>(s.config.clusters));
  } else if (s.dp) {
    at::Tensor mine = at::full({1}, static_cast<int64_t>(s.cluster_hint), at::kLong);
    at::Tensor all = at::empty({s.dp_size}, at::kLong);
    s.dp->all_gather(mine, all)->wait(s.timeout);
    bool any_missing = false;
    for (int i = 0; i < s.dp_size; ++i) {
      ids.push_back(static_cast<int>(all[i].item<int64_t>()));
      any_missing |= ids.back() < 0;
    }
    if (any_missing) ids.assign(s.dp_size, 0);
  } else {
    ids.assign(s.dp_size, 0);
  }
  g.layout = cluster_layout(ids);
  g.cluster = g.layout.cluster_of[s.dp_index];
  const auto& mine = g.layout.local[g.cluster];
  g.local_index = static_cast<int>(std::find(mine.begin(), mine.end(), s.dp_index) - mine.begin());
  if (!s.dp || !split) return g;
  // split() is collective over the data-parallel group: every rank walks every group in the same order.
  for (const auto& ranks : g.layout.local) {
    auto sub = s.dp->split(ranks);
    if (sub && ranks.size() > 1) g.local = std::move(sub);
  }
  const bool overlapped = s.config.fragments > 1 && s.config.overlap_steps > 0;
  if (g.layout.balanced && g.layout.cross.size() == 1 && !overlapped) {
    g.cross = s.dp;  // one rank per cluster: every data-parallel rank
  } else if (g.layout.balanced) {
    for (const auto& ranks : g.layout.cross) {
      auto sub = s.dp->split(ranks);
      if (sub && ranks.size() > 1) g.own_cross = std::move(sub);
    }
    g.cross = g.own_cross.get();
  } else {
    // Clusters of different sizes: their first ranks (the leaders) exchange whole buffers for the cluster.
    std::vector<int> leaders;
    for (const auto& ranks : g.layout.local) leaders.push_back(ranks.front());
    auto sub = s.dp->split(leaders);
    if (sub && leaders.size() > 1) g.own_cross = std::move(sub);
    g.cross = g.own_cross.get();
  }
  return g;
}

}  // namespace

// ---- pure parts ---------------------------------------------------------------------------------------------

ClusterLayout cluster_layout(const std::vector<int>& ids) {
  ClusterLayout l;
  std::map<int, int> renumber;
  for (int id : ids) {
    auto it = renumber.find(id);
    if (it == renumber.end()) it = renumber.emplace(id, static_cast<int>(renumber.size())).first;
    l.cluster_of.push_back(it->second);
  }
  l.clusters = std::max<int>(1, static_cast<int>(renumber.size()));
  l.local.assign(l.clusters, {});
  for (size_t r = 0; r < l.cluster_of.size(); ++r) l.local[l.cluster_of[r]].push_back(static_cast<int>(r));
  for (const auto& g : l.local) l.balanced &= g.size() == l.local[0].size();
  if (l.balanced && !l.local.empty()) {
    for (size_t i = 0; i < l.local[0].size(); ++i) {
      l.cross.emplace_back();
      for (const auto& g : l.local) l.cross.back().push_back(g[i]);
    }
  }
  return l;
}

std::vector<int> block_clusters(int dp, int clusters) {
  if (clusters < 1 || dp % clusters != 0)
    throw UsageError("sync.clusters = " + std::to_string(clusters) + " must divide the " + std::to_string(dp) +
                     " data-parallel ranks");
  std::vector<int> ids;
  for (int r = 0; r < dp; ++r) ids.push_back(r / (dp / clusters));
  return ids;
}

std::vector<int> sized_clusters(int dp, const std::vector<int64_t>& sizes) {
  int64_t sum = 0;
  std::string text;
  bool fits = true;  // each count at most dp: the sum cannot overflow, and the ids below stay bounded
  for (int64_t n : sizes) fits &= n <= dp, sum += std::min<int64_t>(n, dp), text += (text.empty() ? "" : ",") + std::to_string(n);
  if (sizes.empty() || !fits || sum != dp)
    throw UsageError("sync.cluster_ranks = \"" + text + "\" adds up to " + std::to_string(sum) + " ranks but the job has " +
                     std::to_string(dp) + " data-parallel ranks; give each cluster's ranks in rank order");
  std::vector<int> ids;
  for (size_t c = 0; c < sizes.size(); ++c)
    for (int64_t i = 0; i < sizes[c]; ++i) ids.push_back(static_cast<int>(c));
  return ids;
}

std::vector<int64_t> rank_batches(const ClusterLayout& layout, const std::vector<int64_t>& cluster_batch,
                                  int64_t micro_batches) {
  if (cluster_batch.empty()) return {};
  std::string text;
  for (int64_t n : cluster_batch) text += (text.empty() ? "" : ",") + std::to_string(n);
  const std::string key = "sync.cluster_batch = \"" + text + "\"";
  if (static_cast<int>(cluster_batch.size()) != layout.clusters)
    throw UsageError(key + " gives " + std::to_string(cluster_batch.size()) + " counts but the job has " +
                     std::to_string(layout.clusters) +
                     " clusters (sync.clusters, sync.topology or CROSSTRAIN_CLUSTER); give one per cluster");
  std::vector<int64_t> out;
  for (int c : layout.cluster_of) {
    const auto ranks = static_cast<int64_t>(layout.local[c].size());
    if (cluster_batch[c] % (ranks * micro_batches) != 0)
      throw UsageError(key + ": cluster " + std::to_string(c) + "'s " + std::to_string(cluster_batch[c]) +
                       " sequences are not divisible by its " + std::to_string(ranks) + " data-parallel ranks x " +
                       std::to_string(micro_batches) + " micro-batches; use a multiple of " +
                       std::to_string(ranks * micro_batches));
    out.push_back(cluster_batch[c] / ranks);
  }
  return out;
}

int cluster_from_environment() {
  for (const char* name : {"CROSSTRAIN_CLUSTER", "CT_CLUSTER"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      char* end = nullptr;
      long c = std::strtol(v, &end, 10);
      if (*end != '\0' || c < 0) throw UsageError(std::string(name) + " = '" + v + "' must be a cluster number (0, 1, ...)");
      return static_cast<int>(c);
    }
  }
  return -1;
}

int cluster_of_host(const comm::Topology& topology, const std::string& host, const std::string& origin) {
  std::vector<std::string> clusters;
  for (const auto& h : topology.hosts)
    if (std::find(clusters.begin(), clusters.end(), h.cluster) == clusters.end()) clusters.push_back(h.cluster);
  for (const auto& h : topology.hosts)
    if (h.name == host)
      return static_cast<int>(std::find(clusters.begin(), clusters.end(), h.cluster) - clusters.begin());
  std::string names;
  for (const auto& h : topology.hosts) names += (names.empty() ? "" : ", ") + h.name;
  throw UsageError("this host '" + host + "' is not listed in the topology " + origin + " (hosts: " + names +
                   "); add it, or set CROSSTRAIN_CLUSTER instead of sync.topology");
}

int cluster_of_this_node(const std::string& topology_path) {
  if (topology_path.empty()) return cluster_from_environment();
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return cluster_of_host(comm::load_topology(topology_path), name, "'" + topology_path + "' (sync.topology)");
}

void check_sync_config(const SyncConfig& c, int dp, int pp, int tp, int64_t zero) {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw UsageError(m);
  };
  const SyncMode m = c.mode;
  need(c.clusters >= 0, "sync.clusters must be 0 (from the environment) or more");
  if (!c.cluster_ranks.empty()) {
    sized_clusters(dp, parse_cluster_ranks(c.cluster_ranks));  // throws naming the key
    need(zero == 0, "sync.cluster_ranks = \"" + c.cluster_ranks + "\" (clusters of different sizes) averages whole "
                    "parameters across clusters: set parallel.zero = 0");
  }
  need(!c.cluster_ranks.empty() || c.clusters == 0 || dp % c.clusters == 0,
       "sync.clusters = " + std::to_string(c.clusters) + " must divide the " + std::to_string(dp) +
           " data-parallel ranks");
  need(c.inner_steps >= 1 && c.period >= 1, "sync.inner_steps and sync.period must be at least 1");
  need(c.fragments >= 1 && c.overlap_steps >= 0, "sync.fragments must be at least 1 and sync.overlap_steps at least 0");
  need(c.fragments == 1 || c.overlap_steps < c.inner_steps / c.fragments || c.overlap_steps == 0,
       "sync.overlap_steps = " + std::to_string(c.overlap_steps) + " must be less than inner_steps / fragments = " +
           std::to_string(c.inner_steps / c.fragments) + " (one fragment in flight at a time)");
  need(c.staleness >= 0, "sync.staleness must be at least 0");
  need(c.outer_lr > 0 && c.outer_momentum >= 0 && c.outer_momentum < 1,
       "sync.outer_lr must be positive and sync.outer_momentum in [0, 1)");
  if (c.compression != "none") comm::make_codec(c.compression);
  need(c.compression == "none" || m == SyncMode::DiLoCo, "sync.compression applies to sync.mode = \"diloco\"");
  need(!(m == SyncMode::Sync && c.hierarchical) || zero == 0,
       "sync.hierarchical averages whole gradients across clusters: set parallel.zero = 0 (layout dp=" +
           std::to_string(dp) + " x pp=" + std::to_string(pp) + " x tp=" + std::to_string(tp) + ", zero=" +
           std::to_string(zero) + "), or use sync.mode = \"diloco\", which runs with ZeRO inside each cluster");
}

namespace {
std::unique_ptr<SyncStrategy> build_strategy(SyncSetup s) {
  const SyncTraits traits = sync_traits(s.config);
  ClusterGroups g = build_groups(s, traits.cluster_groups);
  // DiLoCo averages whole pseudo-gradients between clusters of any sizes (their leaders exchange them).
  if (traits.cluster_groups && !g.layout.balanced && traits.mode != SyncMode::DiLoCo) {
    std::string sizes;
    for (const auto& l : g.layout.local) sizes += (sizes.empty() ? "" : ", ") + std::to_string(l.size());
    throw UsageError(std::string("sync.mode = ") + to_string(s.config.mode) + " needs the same number of data-parallel ranks in every cluster; got " +
                     sizes);
  }
  switch (traits.mode) {
    case SyncMode::Sync: return make_sync_every_step(std::move(s), std::move(g));
    case SyncMode::DiLoCo: return make_diloco(std::move(s), std::move(g));
    case SyncMode::Gossip: return make_gossip(std::move(s), std::move(g));
    case SyncMode::Ssp:
    case SyncMode::Async: break;
  }
  return make_server_sync(std::move(s), std::move(g));
}
}  // namespace

std::unique_ptr<SyncStrategy> make_sync_strategy(SyncSetup s) {
  std::vector<at::Tensor> now = std::move(s.parameters);
  s.parameters.clear();
  std::unique_ptr<SyncStrategy> strategy = build_strategy(std::move(s));
  if (!now.empty()) {
    strategy->attach(std::move(now), false, {});
    strategy->start(1);
  }
  return strategy;
}

}  // namespace crosstrain::train
