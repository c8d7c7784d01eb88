#include "work.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "crosstrain/models/parallel_plan.h"

namespace crosstrain::planner::detail {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

// Operators one block dispatches (our eager GPT and Llama blocks: norms, linears, views, attention, activation,
// residual adds); the backward runs about two kernels per forward operator.
constexpr double kBlockForwardOps = 24, kBlockBackwardOps = 48;
constexpr double kEmbeddingOps = 4, kHeadForwardOps = 10, kHeadBackwardOps = 16;

// One product of `flops` in the layout's dtype on `device`, `count` times.
double gemm(const DeviceType& device, const std::string& dtype, double flops, double count = 1) {
  return flops <= 0 ? 0.0 : count * flops / device.gemm_rate(flops, dtype);
}

double memory_pass(const DeviceType& device, double bytes) {
  return device.memory_bandwidth_Bps > 0 ? bytes / device.memory_bandwidth_Bps : 0.0;
}

struct Shape {
  double T, h, kv, f, a, s, hd, t, e;
  bool llama, sp;
};

Shape shape_of(const ModelShape& m, const Layout& l) {
  return Shape{d(l.micro_batch * m.seq), d(m.hidden), d(m.kv_heads_or_heads() * m.head_dim()),
               d(m.ffn_or_default()), d(m.heads), d(m.seq), d(m.head_dim()), d(l.tp),
               activation_element_bytes(l), m.arch == models::ModelArch::Llama, l.sequence_parallel && l.tp > 1};
}

// The attention core (scores and mix) of one micro-batch on one tp rank: two batched products per head.
double attention_core_forward(const Shape& x, const DeviceType& dev, const std::string& dtype, double mb) {
  return gemm(dev, dtype, 2 * x.s * x.s * x.hd, 2 * mb * x.a / x.t);
}

PieceCost block_cost(const Shape& x, const Layout& l, const DeviceType& dev, const comm::Link& tp_link,
                     const ClusterSpec* shm) {
  const std::string dtype = compute_dtype(l);
  const double mb = d(l.micro_batch);
  // The block's products on one tp rank (column-parallel qkv and MLP-in, row-parallel out and MLP-out).
  const double matrices = gemm(dev, dtype, 2 * x.T * x.h * (x.h + 2 * x.kv) / x.t) +
                          gemm(dev, dtype, 2 * x.T * x.h * x.h / x.t) +
                          gemm(dev, dtype, 2 * x.T * x.h * x.f / x.t, x.llama ? 2 : 1) +
                          gemm(dev, dtype, 2 * x.T * x.f * x.h / x.t);
  const double core = attention_core_forward(x, dev, dtype, mb);
  // Element-wise passes (bytes read and written): norms and residual adds on the full width (sharded with
  // sequence parallelism), the qkv split, the attention's inputs and output, the MLP activation.
  const double width = x.sp ? x.T * x.h / x.t : x.T * x.h;
  const double bytes = x.e * (10 * width + 2 * x.T * (x.h + 2 * x.kv) / x.t + 4 * x.T * x.h / x.t +
                              (x.llama ? 5 : 2) * x.T * x.f / x.t);
  PieceCost c;
  c.forward = matrices + core + memory_pass(dev, bytes) + kBlockForwardOps * dev.kernel_overhead_s;
  c.backward_input = matrices + 2 * core + memory_pass(dev, 2 * bytes) + 0.6 * kBlockBackwardOps * dev.kernel_overhead_s;
  c.backward_weight = matrices + 0.4 * kBlockBackwardOps * dev.kernel_overhead_s;
  if (l.recompute == "full") c.backward_input += c.forward;
  if (l.recompute == "selective") c.backward_input += core + 6 * dev.kernel_overhead_s;
  if (l.tp > 1) {
    // Two all-reduces per direction (or an all-gather and a reduce-scatter each with sequence parallelism).
    const double bytes_tp = x.T * x.h * x.e;
    const double one = x.sp ? collective_seconds(comm::Collective::AllGather, bytes_tp, l.tp, tp_link) +
                                  collective_seconds(comm::Collective::ReduceScatter, bytes_tp, l.tp, tp_link)
                            : collective_seconds(comm::Collective::AllReduce, bytes_tp, l.tp, tp_link, shm, x.e == 2);
    c.tp_forward = 2 * one;
    c.tp_backward = (l.recompute == "full" ? 4 : 2) * one;
  }
  return c;
}

PieceCost embedding_cost(const Shape& x, const ModelShape& m, const Layout& l, const DeviceType& dev,
                         const comm::Link& tp_link, const ClusterSpec* shm) {
  PieceCost c;
  c.forward = memory_pass(dev, 5 * x.T * x.h * x.e) + kEmbeddingOps * dev.kernel_overhead_s;
  // The dense gradient of the (vocab-sharded) table is zeroed and scattered into.
  c.backward_input = memory_pass(dev, 3 * x.T * x.h * x.e + 4.0 * d(m.vocab) * x.h / x.t) +
                     kEmbeddingOps * dev.kernel_overhead_s;
  if (l.tp > 1) c.tp_forward = collective_seconds(comm::Collective::AllReduce, x.T * x.h * x.e, l.tp, tp_link, shm, x.e == 2);
  return c;
}

PieceCost head_cost(const Shape& x, const ModelShape& m, const Layout& l, const DeviceType& dev,
                    const comm::Link& tp_link, const ClusterSpec* shm) {
  const std::string dtype = compute_dtype(l);
  const double logits = x.T * d(m.vocab) / x.t;
  const double product = gemm(dev, dtype, 2 * x.T * x.h * d(m.vocab) / x.t);
  PieceCost c;
  // Final norm, the vocabulary product, and the loss's soft-max in fp32.
  c.forward = product + memory_pass(dev, 4 * x.T * x.h * x.e + 4 * logits * 4) + kHeadForwardOps * dev.kernel_overhead_s;
  c.backward_input = product + memory_pass(dev, 3 * logits * 4 + 4 * x.T * x.h * x.e) +
                     0.6 * kHeadBackwardOps * dev.kernel_overhead_s;
  c.backward_weight = product + 0.4 * kHeadBackwardOps * dev.kernel_overhead_s;
  if (l.tp > 1) {
    // The vocabulary-parallel loss: three all-reduces of one number per token.
    c.tp_forward = 3 * collective_seconds(comm::Collective::AllReduce, x.T * 4, l.tp, tp_link, shm);
    if (x.sp) c.tp_forward += collective_seconds(comm::Collective::AllGather, x.T * x.h * x.e, l.tp, tp_link);
  }
  return c;
}

}  // namespace

double activation_element_bytes(const Layout& layout) { return layout.precision == "fp32" ? 4.0 : 2.0; }
std::string compute_dtype(const Layout& layout) { return layout.precision == "fp32" ? "fp32" : "bf16"; }

PieceCost& PieceCost::operator+=(const PieceCost& o) {
  forward += o.forward;
  backward_input += o.backward_input;
  backward_weight += o.backward_weight;
  tp_forward += o.tp_forward;
  tp_backward += o.tp_backward;
  return *this;
}

PieceCost PieceCost::scaled(double k) const {
  return PieceCost{forward * k, backward_input * k, backward_weight * k, tp_forward * k, tp_backward * k};
}

PieceCosts piece_costs(const ModelShape& model, const Layout& layout, const DeviceType& device, double slowdown,
                       const comm::Link& tp_link, const ClusterSpec* tp_host) {
  const Shape x = shape_of(model, layout);
  // The host's measured all-reduce in the activations' dtype (bf16 buffers take the link's path there).
  const ClusterSpec* shm = tp_host;
  PieceCosts out{block_cost(x, layout, device, tp_link, shm), embedding_cost(x, model, layout, device, tp_link, shm),
                 head_cost(x, model, layout, device, tp_link, tp_host)};
  // Sharing cores slows the computation; the collectives were measured between such ranks already. The device's
  // measured factor covers what the product/pass/operator model leaves out.
  slowdown *= device.factor(compute_dtype(layout));
  for (PieceCost* p : {&out.block, &out.embedding, &out.head}) {
    p->forward *= slowdown;
    p->backward_input *= slowdown;
    p->backward_weight *= slowdown;
  }
  return out;
}

double collective_seconds(comm::Collective op, double bytes, int n, const comm::Link& link, const ClusterSpec* same_host,
                          bool bf16) {
  if (n <= 1 || bytes <= 0) return 0.0;
  const std::vector<comm::Sample>* measured =
      same_host ? (bf16 ? &same_host->host_allreduce_bf16_curve : &same_host->host_allreduce_curve) : nullptr;
  if (op == comm::Collective::AllReduce && measured && !measured->empty())
    return comm::interpolate(*measured, bytes) * (1.0 + n) / (1.0 + same_host->host_allreduce_ranks);
  double best = std::numeric_limits<double>::infinity();
  for (auto a : {comm::algo::Algorithm::Ring, comm::algo::Algorithm::Tree, comm::algo::Algorithm::HalvingDoubling})
    best = std::min(best, comm::predict(op, a, bytes, n, link));
  return best;
}

namespace {

// Contiguous split of `layers` blocks into stages of per-block cost `block[s]` plus `fixed[s]`, minimising the
// largest stage: the smallest feasible maximum found by bisection, each probe a greedy fill.
std::vector<int64_t> weighted_split(int64_t layers, const std::vector<double>& block, const std::vector<double>& fixed) {
  const int stages = static_cast<int>(block.size());
  auto fill = [&](double limit, std::vector<int64_t>* bounds) {
    int64_t next = 0;
    for (int s = 0; s < stages; ++s) {
      if (bounds) (*bounds)[s] = next;
      const int64_t left_for_others = stages - 1 - s;
      // As many blocks as fit under the limit, leaving one for each later stage.
      const double fit = std::floor((limit - fixed[s]) / block[s]);
      int64_t take = std::max<int64_t>(1, std::min<int64_t>(layers - next - left_for_others,
                                                             fit > 0 ? static_cast<int64_t>(std::min(fit, 1e15)) : 1));
      if (s == stages - 1) take = layers - next;
      if (fixed[s] + take * block[s] > limit * (1 + 1e-12)) return false;
      next += take;
    }
    if (bounds) (*bounds)[stages] = layers;
    return next == layers;
  };
  double lo = 0, hi = 0;
  for (int s = 0; s < stages; ++s) hi = std::max(hi, fixed[s] + layers * block[s]);
  for (int i = 0; i < 40; ++i) {  // to 1e-12 of the range
    const double mid = 0.5 * (lo + hi);
    (fill(mid, nullptr) ? hi : lo) = mid;
  }
  std::vector<int64_t> bounds(stages + 1);
  fill(hi, &bounds);
  // The greedy fill front-loads blocks (2,2,...,1,1); spread them instead, each stage taking its share of what is
  // left by speed, as long as no stage exceeds the best maximum found.
  std::vector<int64_t> spread(stages + 1);
  int64_t next = 0;
  for (int s = 0; s < stages; ++s) {
    spread[s] = next;
    double capacity = 0;
    for (int t = s; t < stages; ++t) capacity += 1.0 / block[t];
    const double ideal = d(layers - next) * (1.0 / block[s]) / capacity - fixed[s] / block[s];
    const int64_t most = std::max<int64_t>(1, static_cast<int64_t>(std::floor((hi * (1 + 1e-12) - fixed[s]) / block[s])));
    int64_t take = std::min<int64_t>({std::max<int64_t>(1, std::llround(ideal)), most, layers - next - (stages - 1 - s)});
    if (s == stages - 1) take = layers - next;
    if (take < 1 || fixed[s] + d(take) * block[s] > hi * (1 + 1e-9)) return bounds;
    next += take;
  }
  spread[stages] = layers;
  return spread;
}

// Interleaved stages: what bounds the step is each rank's sum over its chunks, so the blocks are first split over
// the ranks (by speed, embedding on rank 0, head on rank p-1) and then each rank's share over its chunks.
std::vector<int64_t> interleaved_split(int64_t layers, int p, int v, const std::vector<double>& speed, double embed,
                                       double head) {
  std::vector<double> block(p), fixed(p, 0.0);
  for (int r = 0; r < p; ++r) block[r] = 1.0 / speed[r];
  fixed.front() += embed / speed.front();
  fixed.back() += head / speed[p - 1];
  const std::vector<int64_t> ranks = weighted_split(layers, block, fixed);
  std::vector<int64_t> bounds{0};
  for (int c = 0; c < v; ++c)
    for (int r = 0; r < p; ++r) {
      const int64_t total = ranks[r + 1] - ranks[r];
      const int64_t count = total / v + (c < total % v ? 1 : 0);
      if (count < 1) {  // fewer blocks than chunks on this rank: balance the virtual stages instead
        std::vector<double> vs_block(p * v), vs_fixed(p * v, 0.0);
        for (int s = 0; s < p * v; ++s) vs_block[s] = 1.0 / speed[s % p];
        vs_fixed.front() += embed / speed.front();
        vs_fixed.back() += head / speed[p - 1];
        return weighted_split(layers, vs_block, vs_fixed);
      }
      bounds.push_back(bounds.back() + count);
    }
  return bounds;
}

}  // namespace

std::vector<int64_t> stage_bounds(const ModelShape& model, const Layout& layout, const std::vector<double>& speed) {
  const int stages = layout.pp * layout.chunks;
  if (!layout.stage_layers.empty()) {
    std::vector<int64_t> bounds{0};
    for (int64_t n : layout.stage_layers) bounds.push_back(bounds.back() + n);
    return bounds;
  }
  // partition_gpt's weights: a block 1, the embedding lookup 0.1, the head its product relative to a block's.
  const double embed = 0.1, head = d(model.hidden) * d(model.vocab) / (12.0 * d(model.hidden) * d(model.hidden));
  const bool uniform = std::all_of(speed.begin(), speed.end(), [&](double v) { return v == speed.front(); });
  if (uniform && d(model.layers) * d(model.layers) * stages <= 200000)
    return models::partition_layers(model.layers, stages, embed, head);
  if (layout.chunks > 1 && model.layers >= stages) return interleaved_split(model.layers, layout.pp, layout.chunks, speed, embed, head);
  std::vector<double> block(stages), fixed(stages, 0.0);
  for (int s = 0; s < stages; ++s) block[s] = 1.0 / speed[s];
  fixed.front() += embed / speed.front();
  fixed.back() += head / speed.back();
  return weighted_split(model.layers, block, fixed);
}

ParameterCounts::ParameterCounts(const ModelShape& m)
    : block(m.block_parameters()),
      embedding(m.embedding_parameters()),
      head(m.head_parameters() + (m.arch == models::ModelArch::Llama ? 1 : 2) * d(m.hidden)),
      tied_table(m.tied_embeddings ? d(m.vocab) * d(m.hidden) : 0) {}

double stage_parameters(const ParameterCounts& c, int64_t first_block, int64_t end_block, bool first, bool last) {
  double p = d(end_block - first_block) * c.block;
  if (first) p += c.embedding;
  // A tied head on a later stage than the embedding keeps its own copy of the table (kept equal by an all-reduce).
  if (last) p += c.head + (!first ? c.tied_table : 0);
  return p;
}

double stage_tensors(const ModelShape& model, int64_t blocks, bool first, bool last) {
  return d(blocks) * (model.arch == models::ModelArch::Llama ? 9 : 12) + (first ? 2 : 0) + (last ? 3 : 0);
}

}  // namespace crosstrain::planner::detail
