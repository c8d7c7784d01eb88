// One way to run a training job: the parallel layout, the pipeline schedule, ZeRO, precision, recompute and the
// synchronisation mode across clusters. Pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/parallel/schedule.h"

namespace crosstrain::planner {

// How the data-parallel replicas in different clusters agree (the trainer's sync.mode and sync.hierarchical):
// Sync all-reduces every step over all replicas; Hierarchical every step inside each cluster, then across them;
// DiLoCo inside each cluster every step and across them every inner_steps (an outer step).
enum class LayoutSync { Sync, Hierarchical, DiLoCo };
// Every value, in the order the search and the scheduler try them.
inline constexpr LayoutSync kLayoutSyncs[] = {LayoutSync::Sync, LayoutSync::Hierarchical, LayoutSync::DiLoCo};
// "sync", "hierarchical", "diloco": the words of layouts, the scheduler's state and its JSON. The one place they
// are named; anything else is a UsageError naming the choices.
LayoutSync parse_layout_sync(const std::string& name);
const char* to_string(LayoutSync sync);

// Which of a layout's choices train_overrides() turns into `crosstrain train --set` overrides.
enum class OverrideScope {
  // Every choice: `crosstrain plan` prints a whole run.
  WholeRun,
  // The scheduler's: tp, pp and ZeRO, and the sync keys only when the sync is not plain Sync. The job's spec gives
  // the batch and steps, its recipe the rest; a recipe's own sync mode stays where the layout does not say otherwise
  // (one cluster).
  ShapeAndSync,
};

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int zero = 0;                     // ZeRO stage over dp
  parallel::ScheduleKind schedule = parallel::ScheduleKind::OneFOneB;
  int chunks = 1;                   // interleaved: model chunks per pipeline rank
  int micro_batch = 1;              // sequences per micro-batch
  int microbatches = 1;             // micro-batches per data-parallel replica and step
  bool sequence_parallel = false;
  std::string recompute = "none";   // none, selective, full
  std::string precision = "bf16";   // fp32 or bf16 (mixed: bf16 compute, fp32 master weights)
  LayoutSync sync = LayoutSync::Sync;  // across clusters
  double bucket_mb = 1.0;           // gradient buckets (the trainer's parallel.bucket_mb): one collective each
  int inner_steps = 1;              // diloco: inner steps between outer steps
  std::vector<int64_t> stage_layers;  // blocks per virtual stage; empty: balanced (by speed when devices differ)
  // Sequences per step of each cluster's replicas, when clusters of different speed share the batch; empty: even.
  std::vector<int64_t> cluster_batch;

  int devices() const { return dp * tp * pp; }
  int64_t global_batch() const { return static_cast<int64_t>(dp) * micro_batch * microbatches; }
  // "dp=8 tp=8 pp=16 zero=1 1f1b m=192 mb=1 sp recompute=full bf16 sync"
  std::string describe() const;
  // The crosstrain train overrides that run this layout ("parallel.dp=8", "parallel.stage_layers=\"3,3,2\"", ...):
  // the one bridge from a layout to a run, for `crosstrain plan` (WholeRun) and the scheduler (ShapeAndSync).
  std::vector<std::string> train_overrides(OverrideScope scope = OverrideScope::WholeRun) const;
};

// Parses what describe() prints, and key=value words: dp= tp= pp= zero= schedule= (or a schedule name), v= (chunks),
// m= (micro-batches), mb= (sequences per micro-batch), sp, recompute=, precision= (or bf16 / fp32), sync= (or
// sync / hierarchical / diloco), H= (inner steps), stages=3,3,2, cluster_batch=24,8. Keys not given keep their
// defaults; dp=0 means "the devices left" (the caller resolves it). Throws UsageError naming the word.
Layout parse_layout(const std::string& text);

}  // namespace crosstrain::planner
