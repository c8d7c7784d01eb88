// Elastic training (docs/elastic.md): a rank trains as a member of the generations its membership agrees on
// (elastic/membership.h). Each generation builds its own groups and Run; the state carries over in memory; a
// joining replica gets it from a live one; with no live replica left it comes from the newest checkpoint.
//
// Global batch: every replica keeps its per-replica batch (train.global_batch / the job's replicas) and its slot
// in the data order, so a step with k of n replicas trains on k/n of the global batch (the missing replicas'
// sequences are skipped, not re-read) and averages the gradients over the k live replicas. The learning rate is
// unchanged. This is torchft's rule: the batch shrinks with the job rather than each replica's work growing.
#pragma once

#include "crosstrain/core/launch_env.h"
#include "crosstrain/train/config.h"
#include "crosstrain/jobs/trainer.h"

namespace crosstrain::train {

// Checks that `config` can train elastically on `world` ranks; throws UsageError with the fix otherwise.
void check_elastic_config(const Config& config, int world);
// Joins the job's membership (elastic/membership.h) once it has done what it can alone, then trains as a member
// of the generations that count it until train.steps, or until a step voted while some rank's
// options.stop_requested() said so (Ctrl-C), which every member then saves and stops after (its stopped_after);
// returns what this process trained.
TrainResult train_elastic(const Config& config, const LaunchEnv& env, const TrainOptions& options);

}  // namespace crosstrain::train
