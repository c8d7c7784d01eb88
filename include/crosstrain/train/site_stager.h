// Moves checkpoints between sites in the background (run.site, issue 35): training goes on while the files cross
// the wide-area links. Each site's leader runs one. A new checkpoint starts at every site as the files its own
// ranks wrote, in checkpoints/step_N.staging with staging.json (the manifest to be and every file's size and
// checksum); in rounds over a group of the leaders, each reports what it holds, all compute the same plan
// (staging_plan.h: newest first, resumed where a file was cut off) and move its files a chunk at a time, each
// checked against its checksum before it takes its name; a site whose copy is whole commits it (manifest, rename,
// pruning) unless the run has been fenced off it. What a round cannot finish (a site lost, a process gone) stays
// as it is: the next placement's stager resumes it, or drops it once the site has committed a newer checkpoint.
// After the checkpoints, each series sends the run's outputs (metrics.jsonl) from the first site to the others,
// appended where they left off, so a job re-placed with its first share elsewhere keeps its history.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/checkpoint/faults.h"
#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/staging_plan.h"

namespace crosstrain::train {

struct StagerOptions {
  std::string run_dir;  // this site's
  int keep_last = 0;    // train.keep_checkpoints
  std::string fence;    // run.fence ("": none)
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
  // Gives up a transfer in flight (the peers' waits end by their timeouts) and joins.
  ~SiteStager();
  SiteStager(const SiteStager&) = delete;
  SiteStager& operator=(const SiteStager&) = delete;

  // Every leader, in the same order (the events' rounds are collective over the leaders):
  // the checkpoint of `step` is in step_N.tmp with its staging.json: it becomes step_N.staging and is staged.
  void adopt(int64_t step);
  // A round series for what an earlier placement left half staged.
  void resume();
  // Asks for the end of what is queued so far; drained() says when it is done.
  void drain();
  // Waits up to `patience`: "" once everything before drain() is done, why staging stopped if it did, nullopt
  // while it is still under way.
  std::optional<std::string> drained(std::chrono::milliseconds patience);
  StagingStats stats() const;

 private:
  enum class Kind { Adopt, Resume, Drain };
  struct Event {
    Kind kind;
    int64_t step = 0;
  };
  void post(Event e);
  void loop();
  void handle(const Event& e);
  struct Series {
    std::vector<Transfer> previous;  // the last round's plan: the same again means no progress
    bool outputs_sent = false;
  };
  void series();
  bool round(Series& series);
  std::vector<SiteInventory> exchange(const SiteInventory& mine);
  void send_text(const std::string& text, int to, comm::Millis first_wait);
  std::string receive_text(int from, comm::Millis first_wait);
  void move(const Transfer& t, comm::Millis first_wait);
  void send_file(const Transfer& t, comm::Millis first_wait);
  void receive_file(const Transfer& t, comm::Millis first_wait);
  std::string receive_into(const Transfer& t, const std::filesystem::path& path, comm::Millis first_wait);
  void commit_whole_copies();
  void wait(const comm::WorkPtr& work, comm::Millis timeout) const;
  comm::Millis round_timeout() const;

  std::unique_ptr<comm::Communicator> leaders_;
  const StagerOptions o_;
  const int me_;
  int64_t chunks_in_flight_ = 0;  // of the last round's plan: the next exchange waits for them
  bool held_ = false;             // debug: the test's hold was waited for
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Event> events_;
  int64_t posted_ = 0, done_ = 0;  // events
  int64_t drain_target_ = 0;       // the events drain() waits for
  std::string failure_;           // why the stager stopped ("" while it runs)
  bool ended_ = false;            // the thread has returned
  StagingStats stats_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace crosstrain::train
