// The flight recorder: every rank keeps the last N operations of its communicators (op, group, sequence number,
// state), how far it got in each group, and what it is doing now. A collective that times out asks the other
// ranks for theirs through the control plane (hang_doctor.h) and names the ranks that never reached it.
// The recorder also hands every finished operation to a sink (the trace, obs/trace.h) and sums the time the
// training threads spent blocked in waits (exposed communication, for the straggler scores).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "crosstrain/core/clock.h"

namespace crosstrain::comm {

using crosstrain::monotonic_us;  // core/clock.h: the clock of traces and records

enum class OpState : uint8_t { Issued, Completed, Failed };
const char* to_string(OpState s);

struct OpRecord {
  uint64_t id = 0;         // the recorder's own running number
  int64_t seq = 0;         // collectives: the n-th of the group, the same on every member; p2p: this rank's n-th
  const char* op = "";     // a static name: "all_reduce", "send", ...
  bool p2p = false;
  int group = -1;          // FlightRecorder::group_name(group)
  int peer = -1;           // p2p peer or collective root, as a rank of the group (-1: none)
  int64_t bytes = 0;
  int64_t step = -1;
  int64_t issued_us = 0, finished_us = -1;
  int64_t issue_end_us = -1;   // when the call that issued it returned (a back end may block in it)
  int64_t wait_start_us = -1;  // when a thread first waited for it (-1: nobody waited)
  OpState state = OpState::Issued;
};

// How far one rank got in one group: what it answers when a peer diagnoses a hang.
struct GroupProgress {
  std::string name;
  std::vector<int> members;  // global ranks, in group order
  int64_t issued = 0, completed = 0;  // collectives: the sequence numbers last issued and last completed
  std::string last_op;       // the newest collective of the group ("" when none)
  std::string last_state;
};

struct RankStatus {
  int rank = -1;
  std::string activity;      // "forward" ... ("" when between phases)
  std::string failure;       // its first failed operation ("all_reduce #67 on 'world.g3'"), "" when none
  int64_t step = -1;
  std::vector<GroupProgress> groups;
  std::vector<OpRecord> pending;  // operations issued and not finished (with group names resolved in `pending_groups`)
  std::vector<std::string> pending_groups;
};
std::string to_json(const RankStatus& s);
RankStatus rank_status_from_json(const std::string& text);  // throws Error on garbage

class FlightRecorder {
 public:
  using Sink = std::function<void(const OpRecord&)>;
  FlightRecorder(int global_rank, size_t capacity);
  int rank() const { return rank_; }

  // The trace: called once per operation when it finishes (from the thread that saw it finish).
  void set_sink(Sink sink);
  // A group and its members as global ranks; returns its index. The same name twice gives the same index.
  int register_group(const std::string& name, std::vector<int> members);
  std::string group_name(int group) const;

  // Assigns the sequence number and the id; returns the record as stored.
  OpRecord issue(OpRecord record);
  void finish(OpRecord record, OpState state);
  // Seconds this process's threads spent blocked in waits for operations (exposed communication).
  void add_blocked(int64_t us) { blocked_us_.fetch_add(us, std::memory_order_relaxed); }
  double blocked_seconds() const { return blocked_us_.load(std::memory_order_relaxed) * 1e-6; }

  // What the training thread is doing: a static name and the step (cheap: set around every phase).
  void set_activity(const char* what) { activity_.store(what, std::memory_order_relaxed); }
  const char* activity() const { return activity_.load(std::memory_order_relaxed); }
  void set_step(int64_t step) { step_.store(step, std::memory_order_relaxed); }

  RankStatus status() const;
  std::vector<OpRecord> recent() const;  // the last `capacity` operations, oldest first

 private:
  struct Group {
    std::string name;
    std::vector<int> members;
    int64_t collectives = 0, completed = 0, p2p = 0;
    const char* last_op = "";
    OpState last_state = OpState::Issued;
  };
  int rank_;
  size_t capacity_;
  mutable std::mutex mu_;
  Sink sink_;
  std::vector<Group> groups_;
  std::vector<OpRecord> ring_;  // ring_[id % capacity]
  std::map<uint64_t, OpRecord> in_flight_;  // issued and not finished, whatever the ring kept
  uint64_t next_id_ = 1;
  std::string first_failure_;
  std::atomic<int64_t> blocked_us_{0};
  std::atomic<const char*> activity_{""};
  std::atomic<int64_t> step_{-1};
};

// The text a timed-out rank adds to its error: which members of the group never reached `stuck`'s sequence
// number (and what they were doing), which wait in it too, and which did not answer. Pure: `answers` are the
// statuses that came back through the control plane (the asking rank's own included).
std::string diagnose_hang(const OpRecord& stuck, const std::string& group, const std::vector<int>& members,
                          int asking_rank, const std::vector<RankStatus>& answers, double waited_s);

}  // namespace crosstrain::comm
