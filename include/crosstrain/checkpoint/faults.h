// Storage faults that tests inject into checkpoint saves (the [debug] section of a training config,
// train/config.h). A production run leaves them at their defaults, which inject nothing.
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::checkpoint {

struct StorageFaults {
  // debug.fault_save_delay_ms: a slow disk. Each rank sleeps this long after writing its file (so a test can stop
  // the job while a save is under way), and rank 0 before removing a failed save.
  int64_t save_delay_ms = 0;
  // debug.fault_commit_rename: the commit's final rename fails, as on a full or read-only file system, which no
  // test can cause for root.
  bool commit_rename = false;
  // Staging between sites (train/site_stager.h), set by tests directly: every leader's stager waits for this file
  // to exist before its first transfer (at most a minute), so a test sees training go on while nothing moved.
  std::string stage_hold_file;
  // The link is cut after this many chunks of a file (sender and receiver both stop there), leaving the part
  // that arrived for the next placement to resume. -1: never.
  int64_t stage_cut_chunks = -1;
};

}  // namespace crosstrain::checkpoint
