// A rank's step votes, cast on a thread and store connection of their own.
//
// Every member votes once its gradients are reduced; the last vote commits the step and the coordinator aborts
// the first step a dead member never voted for (membership_logic.h). Cast in line, the vote's two store round
// trips sit on every step's critical path (2.4 ms of a 100 ms gpt-tiny step on 2 cores). Posted here instead, the
// rank applies its update and computes the next step while the store counts the votes, and reads the fate before
// its next vote: at most one vote is in flight, so a rank is never more than one step past what it knows
// committed (ElasticLoop keeps the state from before that step to go back to).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "crosstrain/elastic/membership_logic.h"

#include <c10/util/intrusive_ptr.h>

namespace c10d {
class Store;
}

namespace crosstrain::elastic {

// One member's vote for `step` of generation `generation` (`members` ranks): the last vote decides and writes the
// decision (a generation newer than `generation` published by then is named as the one to switch to after the
// step); the others wait for it. `stop`: this rank was asked to stop.
Decision cast_vote(c10d::Store& store, int64_t generation, int64_t members, int64_t step, bool stop,
                   int64_t latest_generation);

// A store connection of the voter's own: `owner` keeps it open (the rendezvous client it belongs to, if any).
struct VoterConnection {
  c10::intrusive_ptr<c10d::Store> store;
  std::shared_ptr<void> owner;
};

class StepVoter {
 public:
  using Connect = std::function<VoterConnection()>;
  // `connect` opens the voter's store connection (again after a late reply closed it); `latest` is the newest
  // generation the rank's watcher has seen. `answer_within`: how long result() waits for the thread (its store
  // calls have timeouts of their own: this only bounds a thread that is stuck), `rank` names this rank in errors.
  StepVoter(Connect connect, std::shared_ptr<const std::atomic<int64_t>> latest, std::chrono::milliseconds answer_within,
            int rank);
  // A vote still waiting for its decision (a failure the rank is leaving by) is left to finish on its own.
  ~StepVoter();
  StepVoter(const StepVoter&) = delete;
  StepVoter& operator=(const StepVoter&) = delete;

  // Casts the vote on the voter's thread and returns at once; one at a time (a bug otherwise).
  void post(int64_t generation, int64_t members, int64_t step, bool stop);
  bool pending() const;
  // The posted vote's decision, once the store gave it; rethrows the store's error (a CommError when it could
  // not be reached), and throws a CommError naming the rank and step when the thread gave no answer in time.
  // Clears the pending vote either way (a vote given up on is never answered: the generation ends with it).
  Decision result();

 private:
  struct Request {
    int64_t generation = 0, members = 0, step = 0;
    bool stop = false;
  };
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    bool posted = false, answered = false, quit = false;
    bool stale = false;  // the vote in the thread's hands was given up on by result()
    Request request;
    Decision decision;
    std::exception_ptr error;
  };
  static void serve(std::shared_ptr<Shared> shared, Connect connect, std::shared_ptr<const std::atomic<int64_t>> latest);

  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
  const std::chrono::milliseconds answer_within_;
  const int rank_;
  std::thread thread_;
};

}  // namespace crosstrain::elastic
