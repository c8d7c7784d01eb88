// Memory per device: model states by ZeRO stage and precision (the ZeRO paper's accounting: 2 + 2 + 12 bytes a
// parameter in mixed precision, 4 + 4 + 8 in fp32), activations by Korthikanti et al. 2022 (per layer and
// micro-batch s b h (34 + 5 a s / h) bytes at 16 bits, the tensor- and sequence-parallel forms, recompute), the
// schedule's in-flight micro-batches, and the buffers: logits, gradient buckets, ZeRO-3's gathered units.
#include <algorithm>

#include "crosstrain/core/error.h"
#include "work.h"

namespace crosstrain::planner {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

// Activation bytes one block keeps for its backward, per micro-batch, on one tp rank.
double block_activation_bytes(const ModelShape& m, const Layout& l, bool with_recompute) {
  const double s = d(m.seq), b = d(l.micro_batch), h = d(m.hidden), a = d(m.heads), t = d(l.tp);
  const double scale = detail::activation_element_bytes(l) / 2.0;  // the formula counts 16-bit activations
  if (with_recompute && l.recompute == "full") return 2 * s * b * h * scale / (l.sequence_parallel ? t : 1);
  // The formula's 5 a s / h soft-max term is absent: fused attention (ours, FlashAttention) keeps one statistic
  // per row instead of the a x s x s scores, as selective recompute does.
  (void)a;
  const bool sp = l.sequence_parallel && l.tp > 1;
  const double per = sp ? 34 / t : 10 + 24 / t;
  return s * b * h * per * scale;
}

struct ModelStates {
  double parameters, gradients, optimizer;
};

ModelStates model_states(double params, const Layout& l) {
  const bool mixed = l.precision != "fp32";
  ModelStates s{params * (mixed ? 2 : 4), params * (mixed ? 2 : 4), params * (mixed ? 12 : 8)};
  const double dp = l.dp;
  if (l.zero >= 1) s.optimizer /= dp;
  if (l.zero >= 2) s.gradients /= dp;
  if (l.zero >= 3) s.parameters /= dp;
  return s;
}

}  // namespace

MemoryBreakdown estimate_memory(const ModelShape& model, const ClusterFile& cluster, const Layout& layout) {
  const DeviceMap map(cluster, layout.devices());
  const std::vector<double> speed(layout.pp * layout.chunks, 1.0);
  const std::vector<int64_t> bounds = detail::stage_bounds(model, layout, speed);
  const parallel::ScheduleSpec spec{layout.schedule, layout.pp, layout.microbatches, layout.chunks};
  const int vs_count = layout.pp * layout.chunks;
  const detail::ParameterCounts counts(model);
  const double activation_bytes = block_activation_bytes(model, layout, true);
  const double activation_bytes_plain = block_activation_bytes(model, layout, false);
  MemoryBreakdown worst;
  worst.total_bytes = -1;
  for (int r = 0; r < layout.pp; ++r) {
    double params = 0, layers = 0;
    for (int c = 0; c < layout.chunks; ++c) {
      const int vs = c * layout.pp + r;
      params += detail::stage_parameters(counts, bounds[vs], bounds[vs + 1], vs == 0, vs == vs_count - 1);
      layers += d(bounds[vs + 1] - bounds[vs]);
    }
    params /= layout.tp;
    const ModelStates states = model_states(params, layout);
    MemoryBreakdown m;
    m.parameters_bytes = states.parameters;
    m.gradients_bytes = states.gradients;
    m.optimizer_bytes = states.optimizer;
    m.in_flight_microbatches = parallel::activation_bound(spec, r);
    // In-flight counts are in chunk units: each chunk holds 1/v of the rank's layers.
    const double per_layer_in_flight = d(m.in_flight_microbatches) * layers / layout.chunks;
    m.activations_bytes = per_layer_in_flight * activation_bytes;
    m.activations_no_recompute_bytes = per_layer_in_flight * activation_bytes_plain;
    if (layout.recompute == "full")  // one block's full working set while it is recomputed
      m.activations_bytes += activation_bytes_plain;
    const bool last = r == (vs_count - 1) % layout.pp;
    const double tokens = d(layout.micro_batch * model.seq);
    if (last) m.buffers_bytes += 2 * tokens * d(model.vocab) / layout.tp * 4;  // fp32 logits and their gradient
    m.buffers_bytes += 2 * 25e6;  // gradient buckets in flight
    if (layout.zero >= 3) m.buffers_bytes += 2 * counts.block / layout.tp * detail::activation_element_bytes(layout);
    m.total_bytes = m.parameters_bytes + m.gradients_bytes + m.optimizer_bytes + m.activations_bytes + m.buffers_bytes;
    m.capacity_bytes = map.device_of(r * layout.dp * layout.tp).memory_bytes;
    m.fits = m.total_bytes <= m.capacity_bytes;
    const bool more_loaded = m.total_bytes / m.capacity_bytes > worst.total_bytes / std::max(worst.capacity_bytes, 1.0);
    if (worst.total_bytes < 0 || more_loaded) worst = m;
  }
  return worst;
}

}  // namespace crosstrain::planner
