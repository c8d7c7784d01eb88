// --resume continues the run a checkpoint was saved from: the same model, and the same tensors. Checked before
// anything is loaded or written, so a changed recipe or --set cannot load a checkpoint into another model
// (dropping or reinterpreting tensors) and then save the result over the experiment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/train/config.h"

namespace crosstrain::train {

// What differs between the config a checkpoint recorded (`saved`) and this run's, one "KEY: OLD -> NEW" each:
// the model (models::model_differences; for model.arch = "dlrm" also recsys::dlrm_model_differences), then for
// fine-tuning runs the parameters kept fixed (train.freeze, whose weights a checkpoint does not hold) and, while
// any are, model.init_from (where a resumed run reads them again). Empty when the run may resume.
std::vector<std::string> resume_differences(const Config& saved, const Config& run);

// The config recorded in a checkpoint's manifest (`text`; `origin` names it): its [model], [dlrm] and
// train.freeze (the other sections may hold keys of another version and are not needed). Throws UsageError.
Config saved_model_config(const std::string& text, const std::string& origin);

// Throws UsageError unless `run` may resume from `checkpoint_dir` (a checkpoint directory, or a run directory:
// its newest checkpoint): names each difference (resume_differences), or for a GPT-family model each tensor the
// checkpoint lacks or holds beyond what this run trains; says that nothing was changed, and how to start a new
// run from the checkpoint's weights on purpose (model.init_from; DLRM: a new run.dir). Reads the manifest only.
void check_resume_model(const Config& run, const std::string& checkpoint_dir);

// A resumed run may train for more (or fewer) steps than the one that saved `checkpoint_dir`; its learning-rate
// schedule then ends elsewhere. Returns the line that says so (empty when train.steps is the same or the manifest
// records no config).
std::string resume_schedule_notice(const Config& run, const std::string& checkpoint_dir);

// --resume from `checkpoint`, saved after `checkpoint_step`, with train.steps = `steps`: a checkpoint past the
// end of the run is refused (UsageError) rather than training a negative number of steps.
void check_resume_step(const std::string& checkpoint, int64_t checkpoint_step, int64_t steps);

}  // namespace crosstrain::train
