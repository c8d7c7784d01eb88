// The pure logic of elastic membership (no sockets, no threads): who is alive, which replicas form the next
// generation, and how a step's fate is written in the store. The coordinator (coordinator.h) and the ranks
// (membership.h) act on it; tests/unit/pure checks it.
//
// Failure domain: one data-parallel replica (the pp x tp ranks of one model copy). A generation is the set of
// replicas that train together; it changes when a member stops answering (its whole replica leaves) or when a
// complete replica registers (it joins). Every step of a generation ends with a vote in the store: each member
// adds 1 to the step's counter once its gradients are reduced; the member that completes the count writes
// "commit" (and the newest pending generation, if any), while the coordinator, when a member dies, adds a poison
// value to the first incomplete step and writes "abort". The counter is one atomic add, so a step either
// commits on every member or on none.
#pragma once

#include <chrono>
#include <functional>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace crosstrain::elastic {

using Clock = std::chrono::steady_clock;

// Added to a step's vote counter by the coordinator: a count at or above it means the step was closed.
constexpr int64_t kPoison = int64_t{1} << 40;

struct Timing {
  int heartbeat_ms = 100;        // each rank bumps its heartbeat counter this often
  int failure_timeout_ms = 500;  // a rank whose counter has not moved for this long is declared dead
  int min_replicas = 1;          // the job (re)starts, and joins are admitted, once this many replicas are live;
                                 // a failure is published whatever is left (the survivors then wait for joins)
};

// Declares a rank dead when its heartbeat counter stops moving, or at once when its process is known to have
// exited. Pure: the caller passes the time and the counters it read.
class FailureDetector {
 public:
  explicit FailureDetector(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }
  // The counter `value` read at `now` for `rank` (whose current process is `incarnation`).
  void observe(int rank, const std::string& incarnation, int64_t value, Clock::time_point now);
  // The process `pid` of `rank` is gone (the launcher reaped it): dead at once, when it is the incarnation watched.
  void exited(int rank, int pid);
  // Ranks whose incarnation is dead at `now`.
  bool dead(int rank, const std::string& incarnation, Clock::time_point now) const;
  // The launcher reported the exit of this incarnation.
  bool has_exited(int rank, const std::string& incarnation) const;
  // How long ago (at `now`) the last heartbeat of `rank` moved; 0 when never observed.
  std::chrono::milliseconds silent_for(int rank, Clock::time_point now) const;

 private:
  struct Seen {
    std::string incarnation;
    int64_t value = -1;
    Clock::time_point moved{};
    bool exited = false;
  };
  std::chrono::milliseconds timeout_;
  std::map<int, Seen> seen_;
};

// What a rank says about itself when it (re)joins: written by the rank, read by the coordinator.
struct Registration {
  int rank = 0;
  int replica = 0;       // its data-parallel slot in the full job (the sampler's slot)
  int replica_size = 1;  // ranks per replica (pp x tp)
  std::string incarnation;  // unique per process start: "HOST/PID/START_MS" (incarnation_of)
  Timing timing;
  // A rank that comes to the standby store after losing the primary (membership.h, fail_over): the newest
  // generation it knew of, the one it trained in and that one's members (0: a process that never trained).
  int64_t last_generation = 0;
  int64_t trained_in = 0;
  int last_members = 0;
};
std::string incarnation_of(const std::string& host, int pid, int64_t start_ms);
int pid_of_incarnation(const std::string& incarnation);  // -1 when it names none
std::string encode_registration(const Registration& r);
Registration decode_registration(const std::string& text);  // throws std::runtime_error on a malformed record

// One generation: who trains together from which step.
struct Generation {
  int64_t id = 0;
  std::vector<int> replicas;  // ascending slots
  std::vector<int> ranks;     // world ranks of those replicas, ascending: new rank i is ranks[i]
  std::vector<int> survivors; // replicas that were members of the previous generation (they hold live state)
  std::map<int, std::string> incarnations;  // rank -> the process that is the member
  std::string reason;         // "start", "failure", "join"
  bool failure() const { return reason == "failure"; }
  // Index of `rank` in ranks, or -1 when it is not a member.
  int index_of(int rank) const;
  bool has_replica(int replica) const;
};
std::string encode_generation(const Generation& g);
Generation decode_generation(const std::string& text);  // throws std::runtime_error

// What the coordinator knows when it decides: the current generation (id 0: none yet), every registration, and
// which of them are dead.
struct MembershipView {
  const Generation* current = nullptr;
  // The newest generation whose members hold the live state: one that started, or a failure generation (made of
  // survivors) still forming. Null: the same as current. A join generation that has not started is not one.
  const Generation* holders = nullptr;
  std::map<int, Registration> registered;  // by rank; the newest registration of each rank
  std::set<int> dead;                      // ranks whose registered incarnation is dead
  int world_size = 0;                      // ranks of the full job
  bool settle_elapsed = false;             // the first generation may start with fewer replicas than the job has
  int min_start_ranks = 0;                 // ... but with at least this many ranks (--nnodes MIN:MAX: MIN nodes')
  int64_t first_id = 1;                    // the id of a first generation (a standby's: above every old one)
  // A standby's first generation (Takeover): at least quorum_min of its ranks trained in quorum_generation.
  int64_t quorum_generation = 0;
  int quorum_min = 0;
};

// The next generation, or nullopt when nothing changes. A replica is a member when all its ranks are registered
// and alive. The first generation waits for every replica (or, once `settle_elapsed`, for min_replicas); later
// ones drop a replica with a dead rank or a member rank whose process was replaced, and add complete replicas.
// A failure generation keeps only the holders' live replicas: a joiner (even one of a join that has not started
// yet) comes back in a join generation once the survivors train again, so that they never wait for it to recover.
std::optional<Generation> next_generation(const MembershipView& view, int min_replicas);

// What a standby coordinator needs before its first generation, from the registrations of the ranks that lost the
// primary: ids above every generation any of them knew (so no rank mistakes an old record for a new one), and a
// majority of the members of the newest generation one of them started (`reference`), counting only registrants
// that started it (a fresh process, or one from an older generation, is no vote); when none of them ever started a
// generation, every rank of the job (nothing tells it what the primary's side did). The primary's side needs at
// least half of the same generations (primary_keeps_quorum): a side cut off by a broken link cannot go on as a
// second job beside the other.
struct Takeover {
  int64_t first_id = 1;
  int64_t reference = 0;  // 0: no registrant started a generation (then every rank must come over)
  int min_ranks = 1;      // registrants that started the reference generation (or of the world): at least this many
};
Takeover takeover_quorum(const std::map<int, Registration>& registered, int world_size);

// The primary's side of that rule, once a standby exists (crosstrain run --standby): a failure generation is
// published only while this side holds at least half of every generation in the quorum window: the newest one that
// committed a step, and every one started after it (joins included). A rank counts for a window generation when
// the process that generation listed is a member of the failure generation (it must vote for any step to commit,
// so a process that is in truth gone keeps it from training), or when that process's exit was reported here and
// a new process of the rank is alive here (crashed and restarted on this side, not gone to the standby). Every rank
// that went over started one of those generations, or an older one that a committed generation then left with at
// least half of it, so a standby majority and a primary half are never disjoint (ties stay with the primary). With
// nothing started yet: the failure generation's members against half of the job.
struct WindowGeneration {
  int64_t id = 0;
  std::map<int, std::string> incarnations;  // rank -> the process that was the member
  bool committed = false;                   // a step of it committed: the generations before it leave the window
};
// Adds `started` (a generation a member started) and drops what a committed one makes moot. Pure.
void widen_window(std::vector<WindowGeneration>& window, const WindowGeneration& started);
void commit_in_window(std::vector<WindowGeneration>& window, int64_t id);
// `holds(rank, incarnation)`: whether this side holds that member of a window generation (above).
bool primary_keeps_quorum(const std::vector<WindowGeneration>& window,
                          const std::function<bool(int, const std::string&)>& holds, int members, int world_size);

// A step's outcome as written in the store under the step's decision key.
struct Decision {
  bool commit = false;
  int64_t next_generation = 0;  // commit: a pending generation to switch to after this step (0: none);
                                // abort: the generation that redoes this step
  bool stop = false;            // commit, and every member stops after this step (a rank was asked: Ctrl-C, SIGTERM)
};
std::string encode_decision(const Decision& d);
Decision decode_decision(const std::string& text);  // throws std::runtime_error

// Store values are bytes (c10d::Store); records are text.
std::vector<uint8_t> to_bytes(const std::string& text);
std::string from_bytes(const std::vector<uint8_t>& bytes);
// Milliseconds since the epoch, comparable across processes.
int64_t unix_ms();
// The time stamp of elastic log lines: UTC with milliseconds, "2026-12-06T09:14:44.123Z" (ISO 8601; bench/chaos.py
// and the tests read it back). parse_log_time is its inverse; it throws std::runtime_error for anything else.
std::string log_time(int64_t unix_ms);
int64_t parse_log_time(const std::string& text);

// Store keys, all under the job's "elastic/" prefix.
std::string registration_key(int rank);
// A counter each rank increments after it writes its registration or its done_key(): the coordinator reads the
// records only when it moved.
std::string roster_key();
std::string heartbeat_key(int rank);
std::string generation_key(int64_t id);
std::string latest_generation_key();
// Written by a standby coordinator before its first generation: that generation's id (decimal). Ranks that come
// over from the primary wait for it, then for generations from that id on.
std::string first_generation_key();
std::string stop_key();  // set by a rank that was asked to stop, before its next vote  // the id of the newest generation (decimal)
std::string vote_key(int64_t generation, int64_t step);
std::string decision_key(int64_t generation, int64_t step);
// The first step of a generation, written by its members when they start it, or "closed" by the coordinator when
// a failure ended it first (compare-and-set: exactly one of the two wins).
std::string start_key(int64_t generation);
// Written by a rank that finished training: the job is ending, so the coordinator stops changing generations
// (the ranks that finish later are past every collective and must not be aborted).
std::string done_key(int rank);
// Set by the coordinator once a rank is done: processes still waiting to join learn that nothing is left to do.
std::string finished_key();
// Launchers on other nodes than the coordinator's: the pid of a rank's process that exited (written by its
// launcher, then exits_key() is incremented), and the pid of a live process the coordinator excluded (written by
// the coordinator, then exclusions_key() is incremented; its launcher ends it). The counters let each side poll one
// key instead of one per rank.
std::string exited_key(int rank);
std::string exits_key();
std::string exclude_key(int rank);
std::string exclusions_key();
// A member's evidence against another (comm.encrypt: a message from it did not authenticate, so the link to it was
// tampered with, or it holds another key): written by the accuser under accusation_key(generation, accuser), then
// accusations_key() is incremented. The coordinator excludes the accused process as it would a dead one, so the
// accuser's failure is not counted as its own.
struct Accusation {
  int accused = -1;         // world rank
  std::string incarnation;  // the accused process, as the generation lists it
  std::string why;          // the accuser's error, shortened to kMaxAccusationWhy bytes
};
constexpr size_t kMaxAccusationWhy = 400;
std::string encode_accusation(const Accusation& a);
Accusation decode_accusation(const std::string& text);  // throws std::runtime_error
std::string accusation_key(int64_t generation, int accuser);
std::string accusations_key();
// Pure: a pid as a launcher or the coordinator wrote it; -1 for anything that is not a positive decimal int.
int parse_pid(const std::string& text);
constexpr const char* kClosed = "closed";

}  // namespace crosstrain::elastic
