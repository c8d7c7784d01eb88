#include "crosstrain/planner/search.h"

#include <algorithm>
#include <cmath>
#include <chrono>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/placement.h"
#include "work.h"

namespace crosstrain::planner {
namespace {

std::vector<int> divisors(int n) {
  std::vector<int> out;
  for (int k = 1; k <= n; ++k)
    if (n % k == 0) out.push_back(k);
  return out;
}

int device_count(const ClusterFile& cluster, const SearchOptions& o) {
  if (o.global_batch < 1) throw UsageError("the search needs a global batch (sequences per step), e.g. --global-batch 512");
  const int total = cluster.total_devices();
  if (o.devices > total)
    throw UsageError("--devices " + std::to_string(o.devices) + " but the cluster file has " + std::to_string(total));
  return o.devices > 0 ? o.devices : total;
}

int max_tp(const ClusterFile& cluster, const SearchOptions& o) {
  if (o.max_tp > 0) return o.max_tp;
  int m = 1;
  for (const auto& c : cluster.clusters) m = std::max(m, c.devices_per_host);
  return m;
}

struct Schedule {
  parallel::ScheduleKind kind;
  int chunks;
};

std::vector<Schedule> schedules_for(const ModelShape& m, int pp, int microbatches) {
  using K = parallel::ScheduleKind;
  if (pp == 1) return {{K::OneFOneB, 1}};
  std::vector<Schedule> out{{K::GPipe, 1}, {K::OneFOneB, 1}, {K::ZeroBubbleH1, 1}, {K::ZeroBubbleH2, 1}};
  for (int v : {2, 4})
    if (microbatches % pp == 0 && pp * v <= m.layers) out.push_back({K::Interleaved1F1B, v});
  return out;
}

// Each sync across clusters with its inner steps: DiLoCo once per H to try, the others once.
std::vector<std::pair<LayoutSync, int>> syncs_for(const ClusterFile& cluster, const SearchOptions& o, int dp) {
  if (cluster.clusters.size() < 2 || dp < 2) return {{LayoutSync::Sync, 1}};
  std::vector<std::pair<LayoutSync, int>> out{{LayoutSync::Sync, 1}, {LayoutSync::Hierarchical, 1}};
  for (int h : o.diloco_inner_steps) out.push_back({LayoutSync::DiLoCo, h});
  return out;
}

// Whether the clusters hold different devices: then stages are balanced by speed per candidate, and DiLoCo also
// tries batches that follow capability.
bool mixed_devices(const ClusterFile& cluster) {
  for (const auto& c : cluster.clusters)
    if (c.device != cluster.clusters.front().device) return true;
  return false;
}

// DiLoCo over clusters of different devices: each cluster's share of the batch follows its capability (the peak
// FLOP/s of the devices its replicas use), in multiples of its replicas x micro-batches (the trainer keeps the
// micro-batch count and sizes each cluster's micro-batches); empty when that is not possible.
std::vector<int64_t> capability_batch(const ClusterFile& cluster, const Layout& l) {
  const DeviceMap map(cluster, l.devices());
  std::vector<double> peak;  // [cluster]: one device's peak in the layout's precision
  for (const auto& c : cluster.clusters) peak.push_back(cluster.device_of(c).peak(l.precision));
  std::vector<double> capability;
  std::vector<int64_t> unit;  // the cluster's replicas x micro-batches: counts are multiples of it
  int last = -1;
  for (int j = 0; j < l.dp; ++j) {
    const int g = j * l.tp;  // the replica's first stage (pp rank 0)
    const int c = map.place(g).cluster;
    if (c != last) capability.push_back(0), unit.push_back(0), last = c;
    for (int r = 0; r < l.pp; ++r)
      capability.back() += peak[map.place((r * l.dp + j) * l.tp).cluster] * l.tp;
    unit.back() += l.microbatches;
  }
  if (capability.size() < 2) return {};
  double total = 0;
  for (double c : capability) total += c;
  const int64_t batch = l.global_batch();
  std::vector<int64_t> counts;
  int64_t sum = 0;
  for (size_t k = 0; k < capability.size(); ++k) {
    const double ideal = static_cast<double>(batch) * capability[k] / total;
    counts.push_back(std::max<int64_t>(1, std::llround(ideal / unit[k])) * unit[k]);
    sum += counts.back();
  }
  // Put the rounding difference on the most capable cluster, in its units.
  const size_t top = std::max_element(capability.begin(), capability.end()) - capability.begin();
  if ((batch - sum) % unit[top] != 0 || counts[top] + (batch - sum) < unit[top]) return {};
  counts[top] += batch - sum;
  return counts;
}

// Calls `visit(layout)` for every candidate, in a fixed order.
template <typename Visit>
void for_each_layout(const ModelShape& m, const ClusterFile& cluster, const SearchOptions& o, Visit&& visit) {
  const int n = device_count(cluster, o);
  const bool mixed = mixed_devices(cluster);
  for (int tp : divisors(n)) {
    if (tp > max_tp(cluster, o) || m.heads % tp || m.kv_heads_or_heads() % tp) continue;
    for (int pp : divisors(n / tp)) {
      const int dp = n / tp / pp;
      if (pp > m.layers || o.global_batch % dp) continue;
      const int64_t per_replica = o.global_batch / dp;
      for (int mb : o.micro_batches) {
        if (per_replica % mb) continue;
        const int microbatches = static_cast<int>(per_replica / mb);
        if (pp > 1 && microbatches < pp) continue;  // a pipeline needs at least p micro-batches in flight
        for (const Schedule& s : schedules_for(m, pp, microbatches))
          for (int zero = 0; zero <= (dp == 1 ? 0 : pp > 1 ? 2 : 3); ++zero)  // ZeRO-3 needs pp = 1
            for (const char* recompute : {"none", "selective", "full"})
              for (bool sp : {false, true}) {
                if (sp && (tp == 1 || m.seq % tp)) continue;
                for (const std::string& precision : o.precisions)
                  for (const auto& [sync, h] : syncs_for(cluster, o, dp)) {
                    Layout l;
                    l.dp = dp, l.tp = tp, l.pp = pp, l.zero = zero, l.schedule = s.kind, l.chunks = s.chunks;
                    l.micro_batch = mb, l.microbatches = microbatches, l.sequence_parallel = sp;
                    l.recompute = recompute, l.precision = precision, l.sync = sync, l.inner_steps = h;
                    visit(l);
                    if (sync == LayoutSync::DiLoCo && mixed) {
                      l.cluster_batch = capability_batch(cluster, l);
                      if (!l.cluster_batch.empty()) visit(l);
                    }
                  }
              }
      }
    }
  }
}

double rank_key(const Estimate& e, const SearchOptions& o) { return o.rank_by == "cost" ? e.cost : e.time.step_s; }

// Whether `b` only repeats `a` under another sync mode: the same layout otherwise, the same step time and cost. So it
// is when no data-parallel traffic crosses a wide-area link (each replica group inside one cluster): every mode
// then trains alike, and a list of them would show one plan several times.
bool repeats_under_another_sync(const Estimate& a, const Estimate& b) {
  Layout same = b.layout;
  same.sync = a.layout.sync, same.inner_steps = a.layout.inner_steps, same.cluster_batch = a.layout.cluster_batch;
  auto close = [](double x, double y) { return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y)); };
  return same.describe() == a.layout.describe() && close(a.time.step_s, b.time.step_s) && close(a.cost, b.cost);
}

// Adds `e` to a list kept sorted by rank_key and at most `top` long, unless an entry already shows its plan.
void keep_if_among_best(std::vector<Estimate>& best, Estimate e, const SearchOptions& o) {
  if (static_cast<int>(best.size()) == o.top && rank_key(e, o) >= rank_key(best.back(), o)) return;
  for (const Estimate& kept : best)
    if (repeats_under_another_sync(kept, e)) return;
  best.push_back(std::move(e));
  std::stable_sort(best.begin(), best.end(), [&](const Estimate& a, const Estimate& b) { return rank_key(a, o) < rank_key(b, o); });
  if (static_cast<int>(best.size()) > o.top) best.pop_back();
}

}  // namespace

std::vector<Layout> enumerate_layouts(const ModelShape& model, const ClusterFile& cluster, const SearchOptions& options) {
  std::vector<Layout> out;
  for_each_layout(model, cluster, options, [&](const Layout& l) { out.push_back(l); });
  return out;
}

namespace {

// The balanced split of every virtual stage count the candidates use (equal devices: it depends on nothing else),
// computed before the candidates are estimated so that each reads it instead of re-partitioning.
std::map<int, std::vector<int64_t>> splits_of(const ModelShape& model, const std::vector<Layout>& layouts) {
  std::map<int, std::vector<int64_t>> splits;
  for (const Layout& l : layouts) {
    const int stages = l.pp * l.chunks;
    if (splits.count(stages)) continue;
    const std::vector<int64_t> bounds = detail::stage_bounds(model, l, std::vector<double>(stages, 1.0));
    std::vector<int64_t> counts;
    for (int s = 0; s < stages; ++s) counts.push_back(bounds[s + 1] - bounds[s]);
    splits.emplace(stages, counts);
  }
  return splits;
}

// Estimates layouts[begin, end) into `r` (counts and its own top list).
void search_range(const ModelShape& model, const ClusterFile& cluster, const SearchOptions& o,
                  const std::vector<Layout>& layouts, const std::map<int, std::vector<int64_t>>* splits, size_t begin,
                  size_t end, SearchResult& r) {
  EstimateOptions eo;
  eo.tokens = o.tokens;
  for (size_t i = begin; i < end; ++i) {
    Layout l = layouts[i];
    ++r.candidates;
    Estimate e;
    if (splits) {  // equal devices: the split is known, so memory prunes before any time is estimated
      l.stage_layers = splits->at(l.pp * l.chunks);
      const MemoryBreakdown memory = estimate_memory(model, cluster, l);
      if (!memory.fits) {
        ++r.pruned_by_memory;
        continue;
      }
      eo.memory = &memory;
      e = estimate(model, cluster, l, eo);
      eo.memory = nullptr;
    } else {  // devices differ: the estimate balances the stages by speed, and memory follows that split
      e = estimate(model, cluster, l, eo);
      if (!e.memory.fits) {
        ++r.pruned_by_memory;
        continue;
      }
    }
    ++r.feasible;
    keep_if_among_best(r.best, std::move(e), o);
  }
}

}  // namespace

SearchResult search_layouts(const ModelShape& model, const ClusterFile& cluster, const SearchOptions& o) {
  if (o.rank_by != "time" && o.rank_by != "cost") throw UsageError("--rank-by must be time or cost, not '" + o.rank_by + "'");
  if (o.top < 1) throw UsageError("the search's top must be >= 1");
  model.validate();
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Layout> layouts = enumerate_layouts(model, cluster, o);
  // With devices of different speed the estimate balances the stages by speed itself (and reports the split).
  const bool mixed = mixed_devices(cluster);
  const auto splits = mixed ? std::map<int, std::vector<int64_t>>{} : splits_of(model, layouts);
  // Candidates are independent: split them over the cores, each thread with its own top list, merged at the end.
  const size_t threads = std::max<size_t>(1, std::min<size_t>(o.threads > 0 ? o.threads : std::thread::hardware_concurrency(),
                                                              layouts.size() / 256 + 1));
  std::vector<SearchResult> parts(threads);
  std::vector<std::thread> pool;
  std::exception_ptr failure;
  std::mutex failure_mutex;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      try {
        search_range(model, cluster, o, layouts, mixed ? nullptr : &splits, layouts.size() * t / threads,
                     layouts.size() * (t + 1) / threads, parts[t]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(failure_mutex);
        failure = std::current_exception();
      }
    });
  for (auto& th : pool) th.join();
  if (failure) std::rethrow_exception(failure);
  SearchResult r;
  for (auto& p : parts) {
    r.candidates += p.candidates, r.pruned_by_memory += p.pruned_by_memory, r.feasible += p.feasible;
    // In the candidates' order (a layout's sync modes are neighbours, Sync first): a repeat keeps the first.
    for (auto& e : p.best) keep_if_among_best(r.best, std::move(e), o);
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.candidates_per_s = r.seconds > 0 ? r.candidates / r.seconds : 0;
  return r;
}

}  // namespace crosstrain::planner
