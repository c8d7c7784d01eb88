#include "crosstrain/parallel/parallel_dims.h"

#include <algorithm>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {
namespace {

void need(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

std::string factors(const MeshShape& s) {
  return "dp=" + std::to_string(s.dp) + " x pp=" + std::to_string(s.pp) + " x tp=" + std::to_string(s.tp);
}

}  // namespace

ScheduleSpec ParallelDims::schedule_spec() const {
  return ScheduleSpec{schedule, shape.pp, static_cast<int>(microbatches), static_cast<int>(chunks)};
}

std::string ParallelDims::describe() const {
  std::string d = factors(shape) + (sequence_parallel ? " (sequence parallel)" : "");
  if (shape.pp > 1)
    d += ", schedule " + std::string(to_string(schedule)) + " x " + std::to_string(microbatches) + " micro-batches" +
         (chunks > 1 ? " x " + std::to_string(chunks) + " chunks" : "");
  if (zero > 0) d += ", ZeRO-" + std::to_string(zero);
  if (zero > 0 && shape.state_copies() > 1)
    d += " sharded over " + std::to_string(shape.shard_width()) + " ranks x " + std::to_string(shape.state_copies()) +
         " copies (HSDP)";
  return d;
}

std::vector<int64_t> parse_stage_layers(const std::string& text, int stages, int64_t layers) {
  const std::string usage = "parallel.stage_layers = '" + text + "' must give " + std::to_string(stages) +
                            " positive block counts (pp x chunks) adding up to model.n_layer = " +
                            std::to_string(layers) + ", like \"3,3,2\"";
  std::vector<int64_t> bounds{0};
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    int64_t n = 0;
    try {
      size_t used = 0;
      n = std::stoll(item, &used);
      need(used == item.size() || item.find_first_not_of(' ', used) == std::string::npos, usage);
    } catch (const std::logic_error&) {
      throw UsageError(usage);
    }
    need(n >= 1, usage);
    bounds.push_back(bounds.back() + n);
  }
  need(static_cast<int>(bounds.size()) == stages + 1 && bounds.back() == layers, usage);
  return bounds;
}

ParallelDims ParallelDims::resolve(const ParallelConfig& c, int64_t train_micro_batches, int world, int64_t layers) {
  need(c.pp >= 1 && c.tp >= 1 && c.dp >= 0,
       "parallel.pp and parallel.tp must be at least 1 and parallel.dp at least 0 (got dp=" + std::to_string(c.dp) +
           ", pp=" + std::to_string(c.pp) + ", tp=" + std::to_string(c.tp) + ")");
  ParallelDims d;
  d.shape.pp = static_cast<int>(c.pp);
  d.shape.tp = static_cast<int>(c.tp);
  d.shape.dp = c.dp > 0 ? static_cast<int>(c.dp) : std::max(1, world / (d.shape.pp * d.shape.tp));
  d.shape.check(world);
  d.sequence_parallel = c.sequence_parallel;
  need(!c.sequence_parallel || d.shape.tp > 1,
       "parallel.sequence_parallel needs parallel.tp > 1 (layout " + factors(d.shape) + ")");
  d.schedule = parse_schedule(c.schedule);
  d.chunks = c.chunks > 0 ? c.chunks : (d.schedule == ScheduleKind::Interleaved1F1B ? 2 : 1);
  // One count of micro-batches per step (train.micro_batches): gradient accumulation, and a pipeline's
  // micro-batches, of which a pipeline gets at least one per stage (fewer would leave stages idle every step).
  const int64_t wanted = std::max<int64_t>(1, train_micro_batches);
  d.microbatches = d.shape.pp > 1 ? std::max<int64_t>(wanted, d.shape.pp) : wanted;
  if (d.shape.pp > 1) {
    try {
      validate(d.schedule_spec());
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) + " (train.micro_batches = " + std::to_string(train_micro_batches) +
                       ", parallel.pp = " + std::to_string(d.shape.pp) + ")");
    }
  }
  need(c.zero >= 0 && c.zero <= 3,
       "parallel.zero = " + std::to_string(c.zero) + ": use 0 (plain data parallel), 1, 2 or 3");
  d.zero = static_cast<int>(c.zero);
  need(c.dp_shard == 0 || d.zero > 0,
       "parallel.dp_shard = " + std::to_string(c.dp_shard) + " shards ZeRO's state over groups of data-parallel "
       "ranks: set parallel.zero = 1, 2 or 3 with it, or leave dp_shard at 0");
  d.shape.dp_shard = static_cast<int>(c.dp_shard);
  d.shape.check(world);
  need(d.zero < 3 || d.shape.pp == 1,
       "parallel.zero = 3 gathers parameters layer by layer and needs parallel.pp = 1 (layout " + factors(d.shape) +
           "); use parallel.zero = 1 or 2 with pipelines");
  if (!c.stage_layers.empty()) d.bounds = parse_stage_layers(c.stage_layers, d.virtual_stages(), layers);
  return d;
}

}  // namespace crosstrain::parallel
