// A rank's side of elastic membership: it registers, beats its heartbeat, watches for new generations, votes on
// each step (in line, or posted to a thread of its own: step_voter.h), and builds the communicator of each generation it belongs to. The coordinator (coordinator.h)
// decides; membership_logic.h has the rules both follow.
//
// Four store connections: the rank's own (votes cast in line, generation records, Gloo's rendezvous) and three
// light ones that never wait on each other: the heartbeat, the watcher that learns of new generations at once,
// and the voter's. A
// failure generation raises abort_requested(), which every wait of the generation's communicator
// (abortable.h) checks, so no member stays blocked in a collective with a dead peer.
#pragma once

#include <ATen/core/ivalue.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/config.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/elastic/membership_logic.h"
#include "crosstrain/elastic/step_voter.h"

namespace c10d {
class Store;
}

namespace crosstrain::elastic {

// Thrown by a generation's communicator, and by vote(), when a failure ended the generation: the step in flight
// is redone in the next one.
class GenerationEnded : public CommError {
 public:
  GenerationEnded(const CommContext& context, int64_t successor)
      : CommError(context, "a member failed; generation " + std::to_string(successor) + " takes over"),
        successor_(successor) {}
  int64_t successor() const { return successor_; }

 private:
  int64_t successor_;
};

// Thrown when a process joins a job whose training is already over (it was restarted near the end).
class JobFinished : public Error {
 public:
  JobFinished() : Error("the job finished training before this process could join it") {}
};

struct MembershipOptions {
  Timing timing;
  int replica = 0;       // this rank's data-parallel slot in the full job
  int replica_size = 1;  // ranks per replica (pp x tp)
  comm::CommConfig comm;
  int cluster = -1;      // this rank's cluster, for comm.encrypt = "wan" (-1: unknown)
};

class Membership {
 public:
  // Connects to the job's store (retrying while the store still holds this rank's previous process), starts the
  // heartbeat and the watcher, and registers.
  Membership(const LaunchEnv& env, MembershipOptions options);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  int rank() const { return env_.rank; }
  int world_size() const { return env_.world_size; }
  int replica() const { return options_.replica; }
  const std::string& incarnation() const { return incarnation_; }

  // Blocks (up to the job's timeout) until a generation newer than `after` that counts this process as a member
  // is published; throws CommError when the job goes on without it for that long, JobFinished when it ended.
  Generation await_member_generation(int64_t after);
  // The generation `id` (published already).
  Generation generation(int64_t id);
  // Collective over the generation's ranks: its world communicator (Gloo, plus shared memory and the algorithms
  // as comm.* says), whose waits end with GenerationEnded when a failure ends the generation.
  std::unique_ptr<comm::Communicator> build_world(const Generation& g);
  // Marks the first step of `g`; false when the coordinator closed it first (a member failed meanwhile).
  bool start(const Generation& g, int64_t step);
  // This rank's vote for `step` of `g` once its gradients are reduced; returns the step's fate (every member gets
  // the same one). `stop`: this rank was asked to stop (Ctrl-C): the step, once committed, is the job's last.
  Decision vote(const Generation& g, int64_t step, bool stop = false);
  // The same vote, cast on the voter's own thread and connection (step_voter.h): the rank goes on with its
  // update and the next step, and reads the fate with posted_decision() before it votes again.
  void post_vote(const Generation& g, int64_t step, bool stop = false);
  bool vote_posted() const { return voter_ && voter_->pending(); }
  Decision posted_decision() { return voter_->result(); }
  // The fate of a step this rank did not vote for (it was interrupted): waits for the coordinator's abort.
  Decision await_decision(const Generation& g, int64_t step);
  // True once a failure generation newer than `current` is published.
  bool abort_requested(int64_t current) const { return failure_generation_->load() > current; }
  int64_t latest_generation() const { return latest_->load(); }
  // The timeout of each generation's communicator: an operation a failure abandoned has ended after it.
  comm::Millis group_timeout() const { return std::min(options_.comm.timeout(), comm::Millis(10000)); }
  // Training is over on this rank: its exit from now on is not a failure.
  void finish();
  // A member of `g` sent this rank a message that did not authenticate (CommContext::accused, the index of that
  // member in `g`): the coordinator excludes it as it would a dead member. False (nothing written) when `member`
  // is not another member of `g`.
  bool accuse(const Generation& g, int member, const std::string& why);

  // The job's store cannot be reached (tried for about a second), and a standby was named (CROSSTRAIN_STANDBY):
  // the caller may fail_over(). False while the store answers: an error was something else.
  bool primary_lost();
  // Moves this rank to the standby store: its generation is abandoned (the waits of its communicator end), the
  // rank registers there saying the newest generation it knew (`current` or later), the newest one it started
  // (`trained_in`, 0: none) and how many members that had, and waits
  // (up to the job's timeout) for the standby's coordinator to start numbering generations. Then
  // await_member_generation() finds the standby's. Throws CommError when the standby does not take over in time
  // (it takes over only with a majority of the last members: a rank cut off alone waits here and then fails).
  void fail_over(int64_t current, int64_t trained_in, int trained_in_members);
  bool failed_over() const { return failed_over_; }
  std::string store_address() const { return env_.master_addr + ":" + std::to_string(env_.master_port); }
  std::string standby_address() const { return env_.standby_addr + ":" + std::to_string(env_.standby_port); }

 private:
  bool is_member(const Generation& g) const;
  int64_t latest_published();  // the newest generation's id in the store (0: none yet)
  struct Background;
  std::shared_ptr<Background> background() const;
  void start_heartbeat();
  void start_watcher();
  void connect_all();
  void register_rank(int64_t last_generation, int64_t trained_in, int last_members);
  void stop_threads(bool wait);
  std::string get(const std::string& key);
  std::string wait_get(const std::string& key, std::chrono::milliseconds timeout);

  LaunchEnv env_;
  MembershipOptions options_;
  std::string incarnation_;
  std::shared_ptr<comm::Rendezvous> rendezvous_;  // this rank's own store connection
  std::shared_ptr<comm::Rendezvous> beat_, watch_;
  // Shared with the voter's thread, which may outlive this object.
  const std::shared_ptr<std::atomic<int64_t>> latest_ = std::make_shared<std::atomic<int64_t>>(0);
  int64_t first_candidate_ = 1;  // the first generation that can count this process
  // Shared with the predicates of the generations' communicators (helper threads may outlive this object).
  const std::shared_ptr<std::atomic<int64_t>> failure_generation_ = std::make_shared<std::atomic<int64_t>>(0);
  std::shared_ptr<Background> background_;  // the heartbeat's and the watcher's (they may outlive this object)
  std::thread heartbeat_, watcher_;
  std::unique_ptr<StepVoter> voter_;  // started by the first posted vote
  bool failed_over_ = false;  // on the standby's store now (env_ names it)
};

}  // namespace crosstrain::elastic
