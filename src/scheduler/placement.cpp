#include "crosstrain/scheduler/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/estimate.h"

namespace crosstrain::scheduler {
namespace {

using Shares = std::vector<std::pair<int, int>>;  // (cluster index, ranks)

std::string fmt(double v, int precision = 3) {
  std::ostringstream s;
  s.precision(precision);
  s << v;
  return s.str();
}

// The nearest miss so far: later checks (a placement that runs but breaks a QoS limit) say more than earlier ones.
struct Miss {
  int priority = 0;
  std::string text;
  void note(int p, std::string t) {
    if (p >= priority) priority = p, text = std::move(t);
  }
};
enum MissKind { kCapacity = 1, kMemory = 2, kWan = 3, kDeadline = 4, kBudget = 5 };

struct Candidate {
  Shares shares;
  planner::Layout layout;
  double step_s = 0, wan_gbps = 0, cost = 0;
};

// The planner's view of just these devices: each cluster cut to its share, hosts kept whole where the share allows.
planner::ClusterFile sub_file(const Registry& registry, const Shares& shares) {
  const planner::ClusterFile& f = registry.file();
  planner::ClusterFile out;
  out.name = "placement";
  out.wan = f.wan;
  out.wan_links = f.wan_links;
  for (const auto& [i, n] : shares) {
    planner::ClusterSpec c = f.clusters[i];
    c.devices_per_host = std::gcd(n, c.devices_per_host);
    c.hosts = n / c.devices_per_host;
    out.devices.emplace(c.device, f.device_of(f.clusters[i]));
    out.clusters.push_back(std::move(c));
  }
  return out;
}

std::string model_key(const JobSpec& job) {
  const planner::ModelShape& m = job.model;
  std::ostringstream s;
  s << m.name << '/' << models::to_string(m.arch) << '/' << m.layers << '/' << m.hidden << '/' << m.heads << '/' << m.kv_heads << '/'
    << m.ffn << '/' << m.vocab << '/' << m.seq << '/' << m.tied_embeddings << "/b" << job.batch();
  return s.str();
}

class Placer {
 public:
  Placer(const JobSpec& job, const JobProgress& progress, const Registry& registry, const PlacementOptions& options,
         LayoutCache* cache)
      : job_(job), progress_(progress), registry_(registry), options_(options), cache_(cache ? cache : &own_),
        model_key_(model_key(job)) {}

  Decision run();

 private:
  LayoutCache::Entry best_layout(const Shares& shares, const std::vector<int>& tps, const std::vector<int>& pps,
                                 planner::LayoutSync sync);
  LayoutCache::Entry search(const planner::ClusterFile& file, int ranks, const std::vector<int>& tps,
                            const std::vector<int>& pps, planner::LayoutSync sync);
  bool meets_qos(const Shares& shares, double step_s, const std::string& where);
  std::vector<Candidate> single_cluster();
  std::vector<Candidate> spanning();
  void span_set(std::vector<int> set, std::vector<Candidate>& out);
  Shares split(const std::vector<int>& set, int tp) const;
  double wan_gbps(int clusters, double step_s, int inner_steps) const;
  std::string names(const Shares& shares) const;
  std::string why_not(const LayoutCache::Entry& e, const Shares& shares) const;
  Decision decide(std::vector<Candidate> candidates);
  std::vector<std::string> why_each_cluster(const Candidate& best, const std::vector<Candidate>& candidates) const;

  const JobSpec& job_;
  const JobProgress& progress_;
  const Registry& registry_;
  const PlacementOptions& options_;
  LayoutCache own_;
  LayoutCache* cache_;
  std::string model_key_;
  Miss miss_;
  int estimates_ = 0;
};

LayoutCache::Entry Placer::best_layout(const Shares& shares, const std::vector<int>& tps, const std::vector<int>& pps,
                                       planner::LayoutSync sync) {
  std::ostringstream key;
  key << model_key_ << '|' << planner::to_string(sync);
  for (int t : tps) key << ",t" << t;
  for (int p : pps) key << ",p" << p;
  for (const auto& [i, n] : shares) key << '|' << registry_.file().clusters[i].name << ':' << n;
  if (const LayoutCache::Entry* e = cache_->find(key.str())) return *e;
  int ranks = 0;
  for (const auto& s : shares) ranks += s.second;
  LayoutCache::Entry e = search(sub_file(registry_, shares), ranks, tps, pps, sync);
  cache_->put(key.str(), e);
  return e;
}

// Micro-batch counts worth trying for `per_replica` sequences through `pp` stages: the fewest (the largest
// micro-batch, the best GEMMs) that a pipeline of pp stages can fill, then twice and four times as many (a smaller
// pipeline bubble, less activation memory).
namespace {
std::vector<int> microbatch_counts(int64_t per_replica, int pp) {
  std::vector<int> counts;
  int first = 0;
  for (int m = pp; m <= per_replica && first == 0; ++m)
    if (per_replica % m == 0) first = m;
  if (first == 0) return counts;
  for (int m : {first, 2 * first, 4 * first})
    if (m <= per_replica && per_replica % m == 0) counts.push_back(m);
  return counts;
}
// bf16 where every device runs it at least as fast as fp32 (it also halves activations: nothing to weigh);
// both where some device runs fp32 faster (CPUs without bf16 units), for the estimate to choose.
std::vector<const char*> precisions_for(const planner::ClusterFile& file) {
  for (const auto& c : file.clusters) {
    const auto& peak = file.device_of(c).peak_flops;
    const auto fp32 = peak.find("fp32"), bf16 = peak.find("bf16");
    if (fp32 != peak.end() && (bf16 == peak.end() || bf16->second < fp32->second)) return {"bf16", "fp32"};
  }
  return {"bf16"};
}
}  // namespace

// The fastest layout that fits: tp inside a host, pp, dp over the rest; for each, the micro-batching and precision
// the estimate finds fastest; ZeRO-1 and then recompute and ZeRO-3 only when memory needs them.
LayoutCache::Entry Placer::search(const planner::ClusterFile& file, int ranks, const std::vector<int>& tps,
                                  const std::vector<int>& pps, planner::LayoutSync sync) {
  LayoutCache::Entry best;
  const planner::ModelShape& m = job_.model;
  const std::vector<const char*> precisions = precisions_for(file);
  for (int tp : tps) {
    bool host_ok = m.heads % tp == 0 && ranks % tp == 0;
    for (const auto& c : file.clusters) host_ok = host_ok && c.devices_per_host % tp == 0;
    if (!host_ok) continue;
    for (int pp : pps) {
      if (ranks % (tp * pp) != 0 || pp > m.layers) continue;
      const int dp = ranks / (tp * pp);
      if (job_.batch() % dp != 0) continue;
      ++best.shapes;
      const struct { int zero; const char* recompute; } tries[] = {{1, "none"}, {1, "full"}, {3, "full"}};
      for (const auto& t : tries) {
        bool fits = false, runs = true;
        for (int microbatches : microbatch_counts(job_.batch() / dp, pp))
          for (const char* precision : precisions) {
            planner::Layout l;
            l.dp = dp, l.tp = tp, l.pp = pp;
            l.zero = dp > 1 ? t.zero : 0;
            l.recompute = t.recompute;
            l.microbatches = microbatches;
            l.micro_batch = static_cast<int>(job_.batch() / dp / microbatches);
            l.precision = precision;
            l.sync = sync;
            l.inner_steps = sync == planner::LayoutSync::DiLoCo ? options_.diloco_inner_steps : 1;
            if (!runs) break;
            try {
              ++estimates_;
              const planner::MemoryBreakdown mem = planner::estimate_memory(m, file, l);
              if (!mem.fits) continue;
              fits = true;
              planner::EstimateOptions eo;
              eo.memory = &mem;
              const planner::Estimate est = planner::estimate(m, file, l, eo);
              if (est.feasible && (!best.feasible || est.time.step_s < best.step_s)) best = {true, est.layout, est.time.step_s};
            } catch (const UsageError&) {
              runs = false;  // the layout cannot run this model at all (stages, heads): try the next shape
            }
          }
        if (fits || !runs) break;
      }
    }
  }
  return best;
}

std::string Placer::why_not(const LayoutCache::Entry& e, const Shares& shares) const {
  if (e.shapes == 0)
    return "no tp x pp x dp of " + std::to_string(job_.ranks) + " ranks on " + names(shares) + " divides " +
           job_.model.name + "'s heads and layers and the global batch of " + std::to_string(job_.batch());
  return "no layout of " + job_.model.name + " on " + names(shares) + " fits in device memory";
}

std::string Placer::names(const Shares& shares) const {
  std::string s;
  for (const auto& [i, n] : shares) s += (s.empty() ? "" : "+") + registry_.file().clusters[i].name + ":" + std::to_string(n);
  return s;
}

bool Placer::meets_qos(const Shares& shares, double step_s, const std::string& where) {
  const double seconds = step_s * static_cast<double>(progress_.steps_left);
  if (seconds > progress_.seconds_left) {
    miss_.note(kDeadline, where + " would take " + fmt(seconds) + " s for " + std::to_string(progress_.steps_left) +
                              " steps; " + fmt(progress_.seconds_left) + " s are left before the deadline");
    return false;
  }
  double cost = 0;
  for (const auto& [i, n] : shares) cost += n * registry_.info(i).price_per_device_hour * seconds / 3600.0;
  if (cost > progress_.budget_left) {
    miss_.note(kBudget, where + " would cost " + fmt(cost) + "; " + fmt(progress_.budget_left) + " of the budget is left");
    return false;
  }
  return true;
}

std::vector<Candidate> Placer::single_cluster() {
  std::vector<Candidate> out;
  for (int i = 0; i < registry_.size(); ++i) {
    if (!registry_.up(i) || registry_.free(i) < job_.ranks) continue;
    const Shares shares{{i, job_.ranks}};
    const LayoutCache::Entry e = best_layout(shares, options_.tp, options_.pp, planner::LayoutSync::Sync);
    if (!e.feasible) {
      miss_.note(kMemory, why_not(e, shares));
      continue;
    }
    if (!meets_qos(shares, e.step_s, names(shares))) continue;
    out.push_back({shares, e.layout, e.step_s, 0, 0});
  }
  return out;
}

// Ranks in multiples of tp, the fastest devices first; empty when the set cannot hold the job with every cluster
// taking part.
Shares Placer::split(const std::vector<int>& set, int tp) const {
  Shares shares;
  int left = job_.ranks;
  for (int i : set) {
    const int take = std::min(registry_.free(i) / tp * tp, left);
    if (take <= 0) return {};
    shares.push_back({i, take});
    left -= take;
  }
  return left == 0 ? shares : Shares{};
}

double Placer::wan_gbps(int clusters, double step_s, int inner_steps) const {
  const double bytes = 2.0 * (clusters - 1) / clusters * 4.0 * job_.model.parameters() / inner_steps;
  return bytes * 8 / 1e9 / step_s;
}

void Placer::span_set(std::vector<int> set, std::vector<Candidate>& out) {
  std::sort(set.begin(), set.end(),
            [&](int a, int b) { return registry_.info(a).peak_flops > registry_.info(b).peak_flops; });
  const double max_wan = job_.qos.max_wan_gbps < 0 ? std::numeric_limits<double>::infinity() : job_.qos.max_wan_gbps;
  const int k = static_cast<int>(set.size());
  for (int tp : options_.tp) {
    const Shares shares = split(set, tp);
    if (shares.empty()) continue;
    const std::string where = names(shares);
    std::optional<Candidate> synchronous, diloco;
    for (planner::LayoutSync mode : planner::kLayoutSyncs) {
      const LayoutCache::Entry e = best_layout(shares, {tp}, {1}, mode);
      if (!e.feasible) {
        miss_.note(kMemory, why_not(e, shares));
        continue;
      }
      const int h = mode == planner::LayoutSync::DiLoCo ? options_.diloco_inner_steps : 1;
      const double wan = wan_gbps(k, e.step_s, h);
      if (wan > max_wan) {
        miss_.note(kWan, where + " in " + planner::to_string(mode) + " mode needs " + fmt(wan) +
                             " Gbit/s of wide-area bandwidth per cluster; the QoS allows " + fmt(max_wan));
        continue;
      }
      if (!meets_qos(shares, e.step_s, where)) continue;
      Candidate c{shares, e.layout, e.step_s, wan, 0};
      std::optional<Candidate>& slot = h > 1 ? diloco : synchronous;
      if (!slot || c.step_s < slot->step_s) slot = c;
    }
    if (synchronous && (!diloco || diloco->step_s * options_.diloco_min_speedup >= synchronous->step_s))
      out.push_back(*synchronous);
    else if (diloco)
      out.push_back(*diloco);
  }
}

std::vector<Candidate> Placer::spanning() {
  std::vector<Candidate> out;
  std::vector<int> up;
  for (int i = 0; i < registry_.size(); ++i)
    if (registry_.up(i) && registry_.free(i) > 0) up.push_back(i);
  for (size_t a = 0; a < up.size(); ++a)
    for (size_t b = a + 1; b < up.size(); ++b)
      if (registry_.free(up[a]) + registry_.free(up[b]) >= job_.ranks) span_set({up[a], up[b]}, out);
  if (!out.empty()) return out;
  std::sort(up.begin(), up.end(), [&](int a, int b) { return registry_.free(a) > registry_.free(b); });
  for (int k = 3; k <= std::min<int>(options_.max_clusters, static_cast<int>(up.size())) && out.empty(); ++k)
    span_set(std::vector<int>(up.begin(), up.begin() + k), out);
  return out;
}

Decision Placer::decide(std::vector<Candidate> candidates) {
  Decision d;
  d.estimates = estimates_;
  if (candidates.empty()) {
    d.verdict = Verdict::NotNow;
    d.reason = miss_.text;
    return d;
  }
  // Fastest; within 1%, the one leaving the least free on its clusters (best fit keeps big holes for big gangs).
  auto left = [&](const Candidate& c) {
    int n = 0;
    for (const auto& [i, r] : c.shares) n += registry_.free(i) - r;
    return n;
  };
  const Candidate* best = &candidates.front();
  for (const Candidate& c : candidates) {
    if (c.step_s < best->step_s * 0.99 || (c.step_s <= best->step_s * 1.01 && left(c) < left(*best))) best = &c;
  }
  PlacementRecord& p = d.placement;
  for (const auto& [i, n] : best->shares) {
    const planner::Layout& l = best->layout;
    const std::string inside = "dp=" + std::to_string(n / (l.tp * l.pp)) + " tp=" + std::to_string(l.tp) +
                               " pp=" + std::to_string(l.pp);
    p.shares.push_back({registry_.file().clusters[i].name, n, inside});
  }
  p.layout = best->layout.describe();
  p.sync = best->shares.size() > 1 ? best->layout.sync : planner::LayoutSync::Sync;
  p.inner_steps = best->layout.inner_steps;
  p.step_s = best->step_s;
  p.wan_gbps = best->wan_gbps;
  const double seconds = best->step_s * static_cast<double>(progress_.steps_left);
  for (const auto& [i, n] : best->shares) p.cost += n * registry_.info(i).price_per_device_hour * seconds / 3600.0;
  d.verdict = Verdict::Placed;
  d.clusters = why_each_cluster(*best, candidates);
  return d;
}

// Why each cluster was or was not used: the operator's first question about a placement.
std::vector<std::string> Placer::why_each_cluster(const Candidate& best, const std::vector<Candidate>& candidates) const {
  auto has = [](const Candidate& c, int i) {
    return std::any_of(c.shares.begin(), c.shares.end(), [&](const auto& s) { return s.first == i; });
  };
  std::vector<std::string> out;
  for (int i = 0; i < registry_.size(); ++i) {
    const std::string name = registry_.file().clusters[i].name;
    if (has(best, i)) {
      for (const auto& [c, n] : best.shares)
        if (c == i) out.push_back(name + ": used, " + std::to_string(n) + " rank" + (n == 1 ? "" : "s"));
      continue;
    }
    if (!registry_.up(i)) {
      out.push_back(name + ": lost");
      continue;
    }
    if (registry_.free(i) == 0) {
      out.push_back(name + ": full");
      continue;
    }
    const Candidate* with = nullptr;
    for (const Candidate& c : candidates)
      if (has(c, i) && (!with || c.step_s < with->step_s)) with = &c;
    if (with && with->step_s > best.step_s * 1.01)
      out.push_back(name + ": slower, " + fmt(with->step_s) + " s a step with it against " + fmt(best.step_s));
    else if (with)
      out.push_back(name + ": as fast, but the chosen clusters leave fewer devices idle (best fit)");
    else if (best.shares.size() == 1)
      out.push_back(name + ": not needed, the job fits on one cluster (" + std::to_string(registry_.free(i)) + " free here)");
    else
      out.push_back(name + ": not needed, the job fits on fewer clusters (" + std::to_string(registry_.free(i)) +
                    " free here)");
  }
  return out;
}

Decision Placer::run() {
  if (job_.ranks <= 0) throw UsageError("job '" + job_.name + "' asks for " + std::to_string(job_.ranks) + " ranks; give ranks >= 1");
  int largest = 0;
  for (int i = 0; i < registry_.size(); ++i)
    if (registry_.up(i)) largest = std::max(largest, registry_.free(i));
  if (registry_.free_total() < job_.ranks) {
    miss_.note(kCapacity, "needs " + std::to_string(job_.ranks) + " devices; up clusters have " +
                              std::to_string(registry_.free_total()) + " free");
    return decide({});
  }
  std::vector<Candidate> candidates = single_cluster();
  if (candidates.empty() && largest < job_.ranks) {
    if (job_.qos.max_wan_gbps == 0)
      miss_.note(kWan, "no up cluster has " + std::to_string(job_.ranks) + " free devices (largest: " +
                           std::to_string(largest) + ") and the QoS forbids spanning clusters (max_wan_gbps = 0)");
    else
      candidates = spanning();
    if (candidates.empty())
      miss_.note(kCapacity, "no up cluster has " + std::to_string(job_.ranks) + " free devices (largest: " +
                                std::to_string(largest) + ") and no split across clusters fits");
  }
  return decide(std::move(candidates));
}

}  // namespace

const char* to_string(Verdict v) {
  switch (v) {
    case Verdict::Placed: return "placed";
    case Verdict::NotNow: return "not now";
    case Verdict::Never: return "never";
  }
  return "?";
}

const LayoutCache::Entry* LayoutCache::find(const std::string& key) const {
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : &it->second;
}

void LayoutCache::put(const std::string& key, Entry e) { map_[key] = std::move(e); }

JobProgress progress_of(const JobRecord& job, double now_s) {
  JobProgress p;
  p.steps_left = std::max<int64_t>(0, job.spec.steps - job.step);
  if (job.spec.qos.deadline_s > 0) p.seconds_left = job.submitted_s + job.spec.qos.deadline_s - now_s;
  if (job.spec.qos.budget > 0) p.budget_left = job.spec.qos.budget;
  return p;
}

Decision place(const JobSpec& job, const JobProgress& progress, const Registry& registry,
               const PlacementOptions& options, LayoutCache* cache) {
  Decision full = Placer(job, progress, registry, options, cache).run();
  if (full.verdict == Verdict::Placed || job.least_ranks() >= job.ranks) return full;
  // An elastic gang: the most ranks that place now and divide the (unchanged) global batch.
  JobSpec fewer = job;
  fewer.global_batch = job.batch();
  for (int ranks = job.ranks - 1; ranks >= job.least_ranks(); --ranks) {
    if (fewer.global_batch % ranks != 0 || ranks > registry.free_total()) continue;
    fewer.ranks = ranks;
    Decision d = Placer(fewer, progress, registry, options, cache).run();
    d.estimates += full.estimates;
    if (d.verdict == Verdict::Placed) return d;
  }
  return full;
}

Decision classify(const JobSpec& job, const JobProgress& progress, const Registry& registry,
                  const PlacementOptions& options, LayoutCache* cache) {
  Decision now = place(job, progress, registry, options, cache);
  if (now.verdict == Verdict::Placed) return now;
  Decision empty = place(job, progress, registry.all_free(), options, cache);
  if (empty.verdict == Verdict::Placed) return now;
  empty.verdict = Verdict::Never;
  empty.estimates += now.estimates;
  return empty;
}

}  // namespace crosstrain::scheduler
