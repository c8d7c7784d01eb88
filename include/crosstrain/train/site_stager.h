// Moves checkpoints between sites in the background (run.site, issue 35): training goes on while the files cross
// the wide-area links. Each site's leader runs one. A new checkpoint starts at every site as the files its own
// ranks wrote, in checkpoints/step_N.staging with staging.json (the manifest to be, every file's size and checksum,
// and the placement that saved it); in rounds over a group of the leaders, each reports what it holds, all compute
// the same plan (staging_plan.h: newest first, resumed where a file was cut off, never across placements) and move
// its files a chunk at a time, each checked against its checksum before it takes its name; a site whose copy is
// whole commits it (manifest, rename, pruning) unless the run has been fenced off it. What a round cannot finish
// (a site lost, a process gone) stays as it is: the same placement's next generation resumes it, or the site drops
// it once it has committed a newer checkpoint; another placement's copies are dropped. After the checkpoints, each
// series sends the run's outputs (metrics.jsonl) from the first site to the others, appended where they left off,
// so a job re-placed with its first share elsewhere keeps its history.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "crosstrain/checkpoint/faults.h"
#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

struct StagerOptions {
  std::string run_dir;  // this site's
  int keep_last = 0;    // train.keep_checkpoints
  std::string fence;    // run.fence ("": none): the placement whose copies this stager completes and commits
  int64_t chunk_bytes = int64_t{4} << 20;  // per message: a chunk crosses a slow link well within comm.timeout_s
  checkpoint::StorageFaults faults;
};

struct StagingStats {
  int64_t bytes_sent = 0, bytes_received = 0;
  int64_t bytes_resumed = 0;  // not sent again: what receiving sites already held of files cut off before
  int64_t steps_committed = 0;
};

// checkpoints/step_N.staging of a run folder.
std::string staging_dir(const std::string& run_dir, int64_t step);
// The file in a staging directory that describes the checkpoint being gathered.
constexpr const char* kStagingFile = "staging.json";

class SiteStager {
 public:
  // `leaders`: every site's leader, this site's at its rank.
  SiteStager(std::unique_ptr<comm::Communicator> leaders, StagerOptions options);
  // Stops: a wait in progress ends at its timeout (Gloo cannot cancel one); if the thread is still inside it after a
  // few seconds it is left to finish by itself, owning what it uses, so a silent peer never holds the caller.
  ~SiteStager();
  SiteStager(const SiteStager&) = delete;
  SiteStager& operator=(const SiteStager&) = delete;

  // Every leader, in the same order (each event's rounds are collective over the leaders):
  // step_N.tmp, with its staging.json, is this site's part of a new checkpoint: it becomes step_N.staging (at once
  // unless an earlier copy of the step is there, which the thread replaces) and is staged.
  void adopt(int64_t step);
  // A round series for what an earlier generation left half staged.
  void resume();
  // Asks for the end of what is queued so far, and a check that every site holds the newest checkpoint whole.
  void drain();
  // Waits up to `patience`: "" once everything before drain() is done, why staging stopped if it did, nullopt
  // while it is still under way.
  std::optional<std::string> drained(std::chrono::milliseconds patience);
  StagingStats stats() const;

  struct Core;  // the thread's state, shared with it (site_stager.cpp)

 private:
  std::shared_ptr<Core> core_;
  std::thread thread_;
};

}  // namespace crosstrain::train
