// Fencing a run folder (run.fence): the token of the placement that owns a job's run folder is in RUN_DIR/FENCE;
// the rank that commits a checkpoint checks its own token against it first. The scheduler writes it into a run
// folder it shares with the job before it starts a placement; at sites without a shared disk each rank moves its
// site's fence forward to its own placement's token when it starts (advance_fence), never back. An older placement cut off from the scheduler (a partitioned cluster still running, declared
// lost and re-placed) can then never commit a checkpoint that the newer one would resume from. No libtorch: the
// scheduler writes it, the checkpoint writer reads it.
#pragma once

#include <string>

namespace crosstrain {

// Replaces RUN_DIR/FENCE atomically (temporary file, rename); creates the folder. Throws Error when it cannot.
void write_fence(const std::string& run_dir, const std::string& token);
// Whether token `a` names a later placement than `b`: both "JOB.aN" of the same job (the scheduler's
// placement_fence), with a larger attempt N. Tokens of other forms, or of another job, are never later.
bool fence_is_later(const std::string& a, const std::string& b);
// Moves RUN_DIR/FENCE to `token` when it holds none or an earlier placement's (under a lock, so ranks starting
// together agree); leaves it otherwise. Returns "" when `token` holds the fence afterwards, else why not (a later
// placement took the folder over: this one must not train there). An empty token fences nothing: "".
std::string advance_fence(const std::string& run_dir, const std::string& token);
// "" when `token` is empty (no fencing) or RUN_DIR/FENCE holds it; otherwise why a commit is refused.
std::string fence_refusal(const std::string& run_dir, const std::string& token);

}  // namespace crosstrain
