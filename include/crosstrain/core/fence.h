// Fencing a run folder (run.fence): the scheduler writes the token of the placement that owns a job's run folder
// into RUN_DIR/FENCE before it starts that placement; the rank that commits a checkpoint checks its own token
// against it first. An older placement cut off from the scheduler (a partitioned cluster still running, declared
// lost and re-placed) can then never commit a checkpoint that the newer one would resume from. No libtorch: the
// scheduler writes it, the checkpoint writer reads it.
#pragma once

#include <string>

namespace crosstrain {

// Replaces RUN_DIR/FENCE atomically (temporary file, rename); creates the folder. Throws Error when it cannot.
void write_fence(const std::string& run_dir, const std::string& token);
// "" when `token` is empty (no fencing) or RUN_DIR/FENCE holds it; otherwise why a commit is refused.
std::string fence_refusal(const std::string& run_dir, const std::string& token);

}  // namespace crosstrain
