// The parallel layout of a run, resolved and validated once from the `[parallel]` config and the world size:
// how many ranks along each mesh axis, the pipeline schedule and its micro-batches, the model chunks per stage
// and where each virtual stage's blocks begin. Pure: no communication, no model (the model's own limits, such as
// heads divisible by tp, are checked by the model's plan; see models/parallelize.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/parallel/mesh.h"
#include "crosstrain/parallel/schedule.h"

namespace crosstrain::parallel {

// The `[parallel]` section of a run's config.
struct ParallelConfig {
  int64_t dp = 0;                 // data-parallel replicas; 0: world / (pp * tp)
  int64_t pp = 1;                 // pipeline stages
  int64_t tp = 1;                 // tensor-parallel ranks per stage
  bool sequence_parallel = false; // shard LayerNorm/dropout regions along the sequence (needs tp > 1)
  std::string schedule = "1f1b"; // gpipe, 1f1b, interleaved, zb-h1, zb-h2
  int64_t chunks = 0;             // model chunks per stage (interleaved); 0: 2 for interleaved, else 1
  std::string stage_layers;       // blocks per virtual stage, e.g. "3,3,2"; empty: balanced by cost
  double bucket_mb = 1.0;         // gradient all-reduce bucket size
  int64_t zero = 0;               // ZeRO stage over the dp axis: 0 plain, 1 optimizer state, 2 + gradients, 3 + parameters
  int64_t dp_shard = 0;           // ZeRO shards over groups of this many dp ranks, one copy per group (HSDP); 0: all
};

// The [parallel] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(ParallelConfig& c, Key&& key) {
  key("dp", c.dp, "data-parallel replicas; 0: world / (pp x tp)");
  key("pp", c.pp, "pipeline stages (each step runs train.micro_batches micro-batches, at least one per stage)");
  key("tp", c.tp, "tensor-parallel ranks per stage");
  key("sequence_parallel", c.sequence_parallel, "shard LayerNorm and dropout along the sequence (needs tp > 1)");
  key("schedule", c.schedule, "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1 or zb-h2");
  key("chunks", c.chunks, "interleaved: model chunks per stage; 0: 2 for interleaved, else 1");
  key("stage_layers", c.stage_layers, "blocks per virtual stage, e.g. \"3,3,2\"; \"\": balanced by cost");
  key("bucket_mb", c.bucket_mb, "gradient all-reduce bucket size in MB");
  key("zero", c.zero,
      "ZeRO stage over the data-parallel ranks: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters");
  key("dp_shard", c.dp_shard,
      "ZeRO over groups of this many data-parallel ranks, a copy of the state per group (HSDP: a lost group loses "
      "no state); 0: over all of them");
}

struct ParallelDims {
  MeshShape shape;
  bool sequence_parallel = false;
  ScheduleKind schedule = ScheduleKind::OneFOneB;
  int64_t microbatches = 1;     // per data-parallel rank and step
  int64_t chunks = 1;           // model chunks per pipeline rank
  int zero = 0;                 // ZeRO stage
  std::vector<int64_t> bounds;  // first block of each virtual stage, then the end; empty until the model fills it

  int dp() const { return shape.dp; }
  int pp() const { return shape.pp; }
  int tp() const { return shape.tp; }
  int virtual_stages() const { return static_cast<int>(shape.pp * chunks); }
  ScheduleSpec schedule_spec() const;
  // "dp=2 x pp=2 x tp=2 (sequence parallel), schedule 1f1b x 4 micro-batches, ZeRO-1"
  std::string describe() const;

  // Resolves defaults and checks every rule of the layout alone (factors multiply to `world`, schedule and
  // micro-batches, sequence parallelism, ZeRO stage and its combinations, explicit stage_layers against
  // `layers`). `train_micro_batches`: gradient accumulation steps when no pipeline asks for more. Throws
  // UsageError with one line that names every factor involved.
  static ParallelDims resolve(const ParallelConfig& config, int64_t train_micro_batches, int world, int64_t layers);
};

// Pure: "3,3,2" -> block bounds {0, 3, 6, 8}; UsageError unless `stages` positive counts adding up to `layers`.
std::vector<int64_t> parse_stage_layers(const std::string& text, int stages, int64_t layers);

}  // namespace crosstrain::parallel
