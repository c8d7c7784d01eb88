// Whether two [dlrm] sections describe the same tensors: what --resume needs before it loads a DLRM checkpoint
// (train/resume_check.h). No libtorch needed.
#pragma once

#include <string>
#include <vector>

#include "crosstrain/recsys/dlrm_config.h"

namespace crosstrain::recsys {

// Each field in which `now` gives the tables or MLPs of `saved` another shape or meaning, as
// "dlrm.FIELD: OLD -> NEW" (OLD from `saved`): tables (compared as row counts, so "2x1000" equals "1000,1000"),
// embedding_dim, dense_features, bottom_mlp, top_mlp (compared as widths), pooling. Sharding, the optimizers,
// the data and where tables live change no tensor's meaning and are not compared. Empty when they match.
std::vector<std::string> dlrm_model_differences(const DlrmConfig& saved, const DlrmConfig& now);

}  // namespace crosstrain::recsys
