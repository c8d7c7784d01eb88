#include "crosstrain/planner/estimate.h"

#include <algorithm>
#include <cmath>

#include "crosstrain/core/error.h"
#include "work.h"

namespace crosstrain::planner {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

void check_layout(const ModelShape& m, const Layout& l) {
  // Messages are built only on failure: the search checks every candidate.
  auto need = [&](bool ok, const char* what) {
    if (!ok) throw UsageError("layout '" + l.describe() + "' cannot run " + m.name + ": " + what);
  };
  need(l.dp >= 1 && l.tp >= 1 && l.pp >= 1 && l.micro_batch >= 1 && l.microbatches >= 1 && l.chunks >= 1,
       "dp, tp, pp, micro_batch, microbatches and chunks must be >= 1");
  need(m.heads % l.tp == 0 && m.kv_heads_or_heads() % l.tp == 0, "tp must divide the attention heads");
  need(l.zero >= 0 && l.zero <= 3, "zero must be 0..3");
  need(l.zero < 3 || l.pp == 1, "ZeRO-3 gathers parameters layer by layer and needs pp = 1 (as in the trainer)");
  need(d(l.pp) * l.chunks <= d(m.layers), "more virtual stages than layers");
  need(!l.sequence_parallel || m.seq % l.tp == 0, "sequence parallelism needs seq divisible by tp");
  need(l.recompute == "none" || l.recompute == "selective" || l.recompute == "full",
       "recompute must be none, selective or full");
  need(l.precision == "fp32" || l.precision == "bf16", "precision must be fp32 or bf16");
  need(l.inner_steps >= 1, "inner_steps must be >= 1");
  if (!l.stage_layers.empty()) {
    int64_t sum = 0;
    for (int64_t n : l.stage_layers) sum += n >= 1 ? n : -m.layers - 1;
    need(static_cast<int>(l.stage_layers.size()) == l.pp * l.chunks && sum == m.layers,
         "stage_layers must give one count (>= 1) per virtual stage adding up to the layers");
  }
  const bool interleaved = l.schedule == parallel::ScheduleKind::Interleaved1F1B;
  need(interleaved ? l.chunks >= 2 && l.pp >= 2 && l.microbatches % l.pp == 0 : l.chunks == 1,
       "interleaved needs pp >= 2, v >= 2 chunks and micro-batches a multiple of pp; other schedules one chunk");
}

int global_rank(const Layout& l, int pp_rank, int replica) { return (pp_rank * l.dp + replica) * l.tp; }

// Computation on `rank` runs this many times slower than alone: cores shared among more ranks than they number,
// and the measured contention of busy neighbours (memory bandwidth, caches) in proportion to how busy they are.
double compute_slowdown(const DeviceMap& map, const Layout& l, int rank) {
  const double contention = map.device_of(rank).contention_factor(detail::compute_dtype(l));
  return map.slowdown(rank) * (1 + (contention - 1) * map.busy_fraction(rank));
}

// One pipeline (replica `replica`): the costs of each virtual stage on the device that runs it.
struct PipelineCosts {
  std::vector<StageCosts> stages;
  std::vector<int64_t> bounds;
  std::vector<detail::PieceCosts> pieces;  // [pipeline rank]
};

PipelineCosts pipeline_costs(const ModelShape& m, const Layout& l, const DeviceMap& map, int replica) {
  PipelineCosts out;
  const int vs_count = l.pp * l.chunks;
  std::vector<double> speed(vs_count);
  // Pipeline ranks on the same kind of device, sharing as much, over the same tp link cost the same: computed once.
  struct Key {
    const DeviceType* device;
    double slowdown;
    const comm::Link* link;
  };
  std::vector<Key> keys;
  std::vector<detail::PieceCosts> unique;
  for (int r = 0; r < l.pp; ++r) {
    const int g = global_rank(l, r, replica);
    const Key k{&map.device_of(g), compute_slowdown(map, l, g), &map.link(g, g + l.tp - 1)};
    size_t i = 0;
    while (i < keys.size() && !(keys[i].device == k.device && keys[i].slowdown == k.slowdown && keys[i].link == k.link)) ++i;
    if (i < keys.size()) {
      out.pieces.push_back(unique[i]);
      continue;
    }
    keys.push_back(k);
    const bool one_host = map.place(g).host == map.place(g + l.tp - 1).host &&
                          map.place(g).cluster == map.place(g + l.tp - 1).cluster;
    unique.push_back(detail::piece_costs(m, l, *k.device, k.slowdown, *k.link, one_host ? &map.cluster_of(g) : nullptr));
    out.pieces.push_back(unique.back());
  }
  for (int vs = 0; vs < vs_count; ++vs) {
    const auto& b = out.pieces[vs % l.pp].block;
    speed[vs] = 1.0 / (b.forward + b.backward_input + b.backward_weight);
  }
  out.bounds = detail::stage_bounds(m, l, speed);
  for (int vs = 0; vs < vs_count; ++vs) {
    const detail::PieceCosts& p = out.pieces[vs % l.pp];
    detail::PieceCost c = p.block.scaled(d(out.bounds[vs + 1] - out.bounds[vs]));
    if (vs == 0) c += p.embedding;
    if (vs == vs_count - 1) c += p.head;
    StageCosts s;
    s.tp_comm_s = c.tp_forward + c.tp_backward;
    s.forward_s = c.forward + c.tp_forward;
    s.backward_input_s = c.backward_input + c.tp_backward;
    s.backward_weight_s = c.backward_weight;
    s.backward_s = s.backward_input_s + s.backward_weight_s;
    out.stages.push_back(s);
  }
  return out;
}

// ZeRO-3 gathers each unit's parameters before its forward and again before its backward, every micro-batch.
void add_zero3_gathers(const ModelShape& m, const Layout& l, const DeviceMap& map, int replica, PipelineCosts& p) {
  if (l.zero < 3 || l.dp < 2) return;
  const detail::ParameterCounts counts(m);
  const int vs_count = l.pp * l.chunks;
  for (int vs = 0; vs < vs_count; ++vs) {
    const int r = vs % l.pp;
    const auto g = map.span(global_rank(l, r, 0), l.tp, l.dp);
    const double params = detail::stage_parameters(counts, p.bounds[vs], p.bounds[vs + 1], vs == 0, vs == vs_count - 1) / l.tp;
    const double gather = detail::collective_seconds(comm::Collective::AllGather,
                                                     params * detail::activation_element_bytes(l), l.dp, *g.bottleneck);
    const double exposed = gather * (1 - map.device_of(global_rank(l, r, replica)).comm_overlap * 0.5);
    p.stages[vs].forward_s += exposed;
    p.stages[vs].backward_input_s += exposed;
    p.stages[vs].backward_s += exposed;
  }
}

// CPU ranks move pipeline messages with their own cores: that copy time adds to the stage.
void add_message_costs(const Layout& l, const DeviceMap& map, int replica, StepModel& s) {
  const int vs_count = l.pp * l.chunks;
  for (int vs = 0; vs < vs_count; ++vs) {
    const double busy = 1 - map.device_of(global_rank(l, vs % l.pp, replica)).comm_overlap;
    if (busy <= 0) continue;
    double msgs = 0;
    if (vs > 0) msgs += 0.5 * s.boundary_link[vs - 1].seconds(s.boundary_bytes);
    if (vs < vs_count - 1) msgs += 0.5 * s.boundary_link[vs].seconds(s.boundary_bytes);
    s.stages[vs].forward_s += busy * msgs;
    s.stages[vs].backward_input_s += busy * msgs;
    s.stages[vs].backward_s += busy * msgs;
  }
}

void fill_boundaries(const ModelShape& m, const Layout& l, const DeviceMap& map, int replica, StepModel& s) {
  const int vs_count = l.pp * l.chunks;
  s.boundary_bytes = d(l.micro_batch * m.seq) * d(m.hidden) * detail::activation_element_bytes(l) /
                     (l.sequence_parallel ? l.tp : 1);
  for (int vs = 0; vs + 1 < vs_count; ++vs) {
    const int a = global_rank(l, vs % l.pp, replica), b = global_rank(l, (vs + 1) % l.pp, replica);
    s.boundary_link.push_back(map.link(a, b));
    const Placement pa = map.place(a), pb = map.place(b);
    // Messages leaving one host share its network link; inside a host each pair has its own path.
    const bool same_host = pa.cluster == pb.cluster && pa.host == pb.host;
    s.boundary_resource.push_back(same_host ? -1 : pa.cluster * 1000003 + pa.host);
  }
}

// Gradient synchronisation of one pipeline rank per step, by ZeRO stage and sync mode.
double dp_sync_seconds(const Layout& l, const DeviceMap& map, int r, double grad_bytes, double param_bytes,
                       double* wan_per_step) {
  if (l.dp < 2) return 0.0;
  const int first = global_rank(l, r, 0), last = global_rank(l, r, l.dp - 1);
  const auto g = map.span(first, l.tp, l.dp);
  const Placement a = map.place(first), b = map.place(last);
  const ClusterSpec* host = a.cluster == b.cluster && a.host == b.host ? &map.cluster_of(first) : nullptr;
  using comm::Collective;
  // The reducer sends one collective per bucket: each pays the link's latency.
  const double buckets = std::max(1.0, std::ceil(grad_bytes / std::max(l.bucket_mb * (1 << 20), 1.0)));
  auto reduce = [&](int n, const comm::Link& link) {
    const double g = grad_bytes / buckets, p = param_bytes / buckets;
    if (l.zero >= 2)  // reduce-scatter the gradients, all-gather the updated parameters
      return buckets * (detail::collective_seconds(Collective::ReduceScatter, g, n, link) +
                        detail::collective_seconds(Collective::AllGather, p, n, link));
    const double reduce = buckets * detail::collective_seconds(Collective::AllReduce, g, n, link, host);
    // ZeRO-1: every rank updates its shard of the optimizer state, then the updated parameters are all-gathered.
    return l.zero == 1 ? reduce + buckets * detail::collective_seconds(Collective::AllGather, p, n, link) : reduce;
  };
  if (g.clusters <= 1 || l.sync == LayoutSync::Sync) return reduce(l.dp, *g.bottleneck);
  const double inside = reduce(g.per_cluster, *g.inside_cluster);
  if (l.sync == LayoutSync::Hierarchical)
    return inside + detail::collective_seconds(Collective::AllReduce, grad_bytes, g.clusters, *g.bottleneck);
  // DiLoCo: every H inner steps the fp32 pseudo-gradient of this rank's shard crosses the wide area.
  const double outer = detail::collective_seconds(Collective::AllReduce, param_bytes / detail::activation_element_bytes(l) * 4,
                                                  g.clusters, *g.bottleneck);
  *wan_per_step = std::max(*wan_per_step, outer / l.inner_steps);
  return inside;
}

void fill_sync_and_optimizer(const ModelShape& m, const Layout& l, const DeviceMap& map, int replica,
                             const std::vector<int64_t>& bounds, StepModel& s) {
  const int vs_count = l.pp * l.chunks;
  const detail::ParameterCounts counts(m);
  for (int r = 0; r < l.pp; ++r) {
    double params = 0, tensors = 0;
    for (int c = 0; c < l.chunks; ++c) {
      const int vs = c * l.pp + r;
      params += detail::stage_parameters(counts, bounds[vs], bounds[vs + 1], vs == 0, vs == vs_count - 1);
      tensors += detail::stage_tensors(m, bounds[vs + 1] - bounds[vs], vs == 0, vs == vs_count - 1);
    }
    params /= l.tp;
    // Gradients are reduced in fp32 (bf16 buckets too); parameters gathered in the compute precision.
    s.dp_bytes.push_back(params * 4);
    s.dp_sync_s.push_back(dp_sync_seconds(l, map, r, params * 4, params * detail::activation_element_bytes(l),
                                          &s.wan_s_per_step));
    const DeviceType& dev = map.device_of(global_rank(l, r, replica));
    const double local = l.zero >= 1 ? params / l.dp : params;
    // Adam reads parameter, gradient and two moments and writes three (plus the bf16 copy); the gradient norm
    // reads the gradients once; each parameter tensor costs a dozen operators.
    const double bytes = local * (l.precision == "fp32" ? 28 : 34) + params * 4;
    const double ops = (l.zero >= 1 ? tensors / l.dp + 4 : tensors) * 12;
    const double passes = dev.memory_bandwidth_Bps > 0 ? bytes / dev.memory_bandwidth_Bps : 0.0;  // 0: free
    s.optimizer_s.push_back((passes + ops * dev.kernel_overhead_s) *
                            compute_slowdown(map, l, global_rank(l, r, replica)));
  }
  s.dp_overlap = map.device_of(global_rank(l, 0, replica)).comm_overlap;
}

StepModel step_model_of_replica(const ModelShape& m, const Layout& l, const DeviceMap& map, int replica) {
  StepModel s;
  s.schedule = parallel::ScheduleSpec{l.schedule, l.pp, l.microbatches, l.chunks};
  PipelineCosts p = pipeline_costs(m, l, map, replica);
  add_zero3_gathers(m, l, map, replica, p);
  s.stages = p.stages;
  for (size_t vs = 0; vs + 1 < p.bounds.size(); ++vs) s.stage_layers.push_back(p.bounds[vs + 1] - p.bounds[vs]);
  for (int r = 0; r < l.pp; ++r) s.pp_rank_place.push_back(map.place(global_rank(l, r, replica)));
  fill_boundaries(m, l, map, replica, s);
  add_message_costs(l, map, replica, s);
  fill_sync_and_optimizer(m, l, map, replica, p.bounds, s);
  return s;
}

// Per pipeline rank, over its chunks: forward, backward, and each part.
struct RankWork {
  double f = 0, b = 0, bi = 0, bw = 0, tp = 0;
};

std::vector<RankWork> rank_work(const StepModel& s) {
  std::vector<RankWork> w(s.schedule.stages);
  for (size_t vs = 0; vs < s.stages.size(); ++vs) {
    RankWork& x = w[vs % s.schedule.stages];
    x.f += s.stages[vs].forward_s;
    x.b += s.stages[vs].backward_s;
    x.bi += s.stages[vs].backward_input_s;
    x.bw += s.stages[vs].backward_weight_s;
    x.tp += s.stages[vs].tp_comm_s;
  }
  return w;
}

// The idle time a rank adds to the pipeline's critical path (Narayanan et al. 2021; Qi et al. 2023): for equal
// stages (p - 1) times this is the schedule's bubble.
double bubble_share(const StepModel& s, const RankWork& w) {
  switch (s.schedule.kind) {
    case parallel::ScheduleKind::GPipe:
    case parallel::ScheduleKind::OneFOneB: return w.f + w.b;
    case parallel::ScheduleKind::Interleaved1F1B: return (w.f + w.b) / s.schedule.chunks;
    case parallel::ScheduleKind::ZeroBubbleH1: return std::max(w.f, w.f + w.bi - w.bw);
    case parallel::ScheduleKind::ZeroBubbleH2: return w.f;
  }
  return w.f + w.b;
}

TimeBreakdown analytic_time(const StepModel& s) {
  const std::vector<RankWork> w = rank_work(s);
  const int p = s.schedule.stages, m = s.schedule.microbatches;
  int slowest = 0;
  for (int r = 1; r < p; ++r)
    if (w[r].f + w[r].b > w[slowest].f + w[slowest].b) slowest = r;
  TimeBreakdown t;
  t.tp_exposed_s = m * w[slowest].tp;
  t.compute_s = m * (w[slowest].f + w[slowest].b) - t.tp_exposed_s;
  for (int r = 0; r < p; ++r)
    if (r != slowest) t.pp_bubble_s += bubble_share(s, w[r]);
  // The first micro-batch's activations and the last one's gradients cross every boundary on the critical path.
  for (size_t b = 0; b < s.boundary_link.size() && p > 1; ++b)
    t.pp_transfer_s += 2 * s.boundary_link[b].seconds(s.boundary_bytes) / s.schedule.chunks;
  double tail = 0;
  for (int r = 0; r < p; ++r) {
    const double sync = s.dp_sync_s.empty() ? 0 : s.dp_sync_s[r];
    const double exposed = sync - s.dp_overlap * std::min(sync, w[r].b);  // the replay's rule, bounded by backward
    const double opt = s.optimizer_s.empty() ? 0 : s.optimizer_s[r];
    if (exposed + opt > tail) tail = exposed + opt, t.dp_exposed_s = exposed, t.optimizer_s = opt;
  }
  t.wan_exposed_s = s.wan_s_per_step;
  t.step_s = t.compute_s + t.tp_exposed_s + t.pp_bubble_s + t.pp_transfer_s + t.dp_exposed_s + t.wan_exposed_s +
             t.optimizer_s;
  return t;
}

std::string binding_wall(const TimeBreakdown& t, const MemoryBreakdown& mem) {
  if (!mem.fits) return "memory";
  const double comm = t.tp_exposed_s + t.pp_transfer_s + t.dp_exposed_s + t.wan_exposed_s;
  return comm > t.compute_s ? "communication" : "compute";
}

}  // namespace

namespace {

// DiLoCo with a per-cluster batch, as the trainer runs sync.cluster_batch: every replica keeps the layout's
// micro-batch count and each cluster's micro-batches hold its share; the slowest cluster sets the pace (the
// others wait for it at the outer step).
StepModel step_model_by_cluster_batch(const ModelShape& model, const Layout& layout, const DeviceMap& map) {
  std::vector<int> first_replica, replicas;  // per cluster of the replicas' first stage, in order
  std::vector<int> cluster_ids;
  for (int j = 0; j < layout.dp; ++j) {
    const int c = map.place(global_rank(layout, 0, j)).cluster;
    if (cluster_ids.empty() || cluster_ids.back() != c) cluster_ids.push_back(c), first_replica.push_back(j), replicas.push_back(0);
    ++replicas.back();
  }
  auto fail = [&](const std::string& why) {
    throw UsageError("layout '" + layout.describe() + "': cluster_batch " + why);
  };
  if (layout.sync != LayoutSync::DiLoCo) fail("needs sync=diloco (clusters that meet only at outer steps)");
  if (layout.cluster_batch.size() != cluster_ids.size())
    fail("needs one count per cluster the replicas span (" + std::to_string(cluster_ids.size()) + ")");
  int64_t sum = 0;
  StepModel slowest;
  double slowest_s = -1;
  for (size_t k = 0; k < cluster_ids.size(); ++k) {
    const int64_t per_replica = layout.cluster_batch[k] / replicas[k];
    sum += layout.cluster_batch[k];
    if (layout.cluster_batch[k] % (static_cast<int64_t>(replicas[k]) * layout.microbatches))
      fail("count " + std::to_string(layout.cluster_batch[k]) +
           " is not a multiple of the cluster's replicas x micro-batches (m)");
    Layout local = layout;
    local.micro_batch = static_cast<int>(per_replica / layout.microbatches);
    check_layout(model, local);
    StepModel s = step_model_of_replica(model, local, map, first_replica[k]);
    const double t = analytic_time(s).step_s;
    if (t > slowest_s) slowest_s = t, slowest = std::move(s);
  }
  if (sum != layout.global_batch()) fail("must add up to the global batch (" + std::to_string(layout.global_batch()) + ")");
  return slowest;
}

}  // namespace

StepModel build_step_model(const ModelShape& model, const ClusterFile& cluster, const Layout& layout) {
  model.validate();
  check_layout(model, layout);
  const DeviceMap map(cluster, layout.devices());
  if (!layout.cluster_batch.empty()) return step_model_by_cluster_batch(model, layout, map);
  // Replicas differ only by where they run: the first and the last are the farthest apart (different clusters
  // when the data-parallel axis spans several); the slower one sets the pace of a synchronous step.
  StepModel first = step_model_of_replica(model, layout, map, 0);
  bool alike = true;  // the last replica runs on the same clusters with the same sharing: it costs the same
  for (int r = 0; r < layout.pp && alike; ++r) {
    const int a = global_rank(layout, r, 0), b = global_rank(layout, r, layout.dp - 1);
    alike = map.place(a).cluster == map.place(b).cluster && compute_slowdown(map, layout, a) == compute_slowdown(map, layout, b);
  }
  if (layout.dp == 1 || alike) return first;
  StepModel last = step_model_of_replica(model, layout, map, layout.dp - 1);
  return analytic_time(last).step_s > analytic_time(first).step_s ? last : first;
}

Estimate estimate(const ModelShape& model, const ClusterFile& cluster, const Layout& layout,
                  const EstimateOptions& options) {
  Estimate e;
  e.layout = layout;
  e.step_model = build_step_model(model, cluster, layout);
  e.time = analytic_time(e.step_model);
  if (e.layout.stage_layers.empty()) e.layout.stage_layers = e.step_model.stage_layers;
  e.memory = options.memory ? *options.memory : estimate_memory(model, cluster, e.layout);
  const DeviceMap map(cluster, layout.devices());
  const bool full = layout.recompute == "full";
  e.tokens_per_step = d(layout.global_batch()) * d(model.seq);
  e.model_flops_per_step = e.tokens_per_step * model.flops_per_token();
  e.hardware_flops_per_step = e.tokens_per_step * model.hardware_flops_per_token(full);
  e.tokens_per_s = e.tokens_per_step / e.time.step_s;
  const int n = layout.devices();
  e.flops_per_device = e.hardware_flops_per_step / e.time.step_s / n;
  double peak = 0, power = 0, price = 0;
  int left = n;  // devices fill the clusters in file order
  for (const ClusterSpec& c : cluster.clusters) {
    const double used = std::min(left, c.devices());
    left -= static_cast<int>(used);
    const DeviceType& dev = cluster.device_of(c);
    peak += used * dev.peak(detail::compute_dtype(layout));
    power += used * dev.power_w;
    price += used * cluster.price_per_device_hour(c);
  }
  e.mfu = e.model_flops_per_step / e.time.step_s / peak;
  const double steps = options.tokens > 0 ? std::ceil(options.tokens / e.tokens_per_step) : 1.0;
  e.time_to_train_s = steps * e.time.step_s;
  e.device_hours = e.time_to_train_s / 3600.0 * n;
  e.cost = e.time_to_train_s / 3600.0 * price;
  e.energy_j = e.time_to_train_s * power;
  // One device running the same work at the same per-operation speed, without communication or bubble.
  e.scaling_efficiency = e.time.compute_s / e.time.step_s;
  e.wall = binding_wall(e.time, e.memory);
  e.feasible = e.memory.fits;
  if (!e.feasible)
    e.infeasible_reason = "needs " + std::to_string(static_cast<long long>(e.memory.total_bytes / 1e6)) +
                          " MB per device; the device has " +
                          std::to_string(static_cast<long long>(e.memory.capacity_bytes / 1e6)) + " MB";
  return e;
}

}  // namespace crosstrain::planner
