#include "crosstrain/elastic/step_voter.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include "crosstrain/core/error.h"

namespace crosstrain::elastic {

// Two store round trips per member: the add, then (all but the last voter) one get that waits on the server for
// the decision. The last voter learns of a pending generation from the rank's watcher, not from the store.
Decision cast_vote(c10d::Store& store, int64_t generation, int64_t members, int64_t step, bool stop,
                   int64_t latest_generation) {
  // Before the vote: the last voter, who decides, sees every request made before any vote it counts.
  if (stop) store.set(stop_key(), to_bytes("1"));
  const int64_t count = store.add(vote_key(generation, step), 1);
  if (count == members) {
    // The last vote: the step commits; a generation published meanwhile starts after it on every member.
    Decision d;
    d.commit = true;
    d.stop = store.check({stop_key()});
    d.next_generation = latest_generation > generation ? latest_generation : 0;
    // The coordinator writes it too when it closes the generation (this voter may die before its write): the
    // first write stands, so every member reads the same decision.
    return decode_decision(from_bytes(store.compareSet(decision_key(generation, step), {}, to_bytes(encode_decision(d)))));
  }
  // The last voter writes it at once; the coordinator writes an abort within the failure timeout of a death.
  return decode_decision(from_bytes(store.get(decision_key(generation, step))));
}

StepVoter::StepVoter(Connect connect, std::shared_ptr<const std::atomic<int64_t>> latest,
                     std::chrono::milliseconds answer_within, int rank)
    : answer_within_(answer_within), rank_(rank), thread_([shared = shared_, connect = std::move(connect), latest = std::move(latest)] {
        serve(shared, connect, latest);
      }) {}

StepVoter::~StepVoter() {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->quit = true;
  }
  shared_->cv.notify_all();
  // It may be inside a store call a failure abandoned: that ends within the connection's timeout, by itself.
  if (thread_.joinable()) thread_.detach();
}

void StepVoter::post(int64_t generation, int64_t members, int64_t step, bool stop) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->posted || shared_->answered)
      throw Error("elastic: step " + std::to_string(step) + "'s vote posted while another one is pending (a bug)");
    shared_->request = Request{generation, members, step, stop};
    shared_->posted = true;
  }
  shared_->cv.notify_all();
}

bool StepVoter::pending() const {
  std::lock_guard<std::mutex> lock(shared_->mu);
  return shared_->posted || shared_->answered;
}

Decision StepVoter::result() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  if (!shared_->posted && !shared_->answered) throw Error("elastic: no step vote is pending (a bug)");
  if (!shared_->cv.wait_for(lock, answer_within_, [&] { return shared_->answered; })) {
    // The thread is stuck in a call it cannot leave: this rank stops waiting; a late answer is dropped.
    const Request r = shared_->request;
    shared_->posted = false;
    shared_->stale = true;
    CommContext context;
    context.rank = rank_;
    context.op = "vote";
    context.group = "elastic";
    context.step = r.step;
    throw CommError(context, "no answer from the store to the vote of generation " + std::to_string(r.generation) +
                                 " within " + std::to_string(answer_within_.count()) +
                                 " ms (is node 0's launcher, which holds the store, still running?)",
                    true);
  }
  shared_->answered = false;
  if (shared_->error) std::rethrow_exception(std::exchange(shared_->error, nullptr));
  return shared_->decision;
}

void StepVoter::serve(std::shared_ptr<Shared> shared, Connect connect,
                      std::shared_ptr<const std::atomic<int64_t>> latest) {
  VoterConnection connection;
  for (;;) {
    Request r;
    {
      std::unique_lock<std::mutex> lock(shared->mu);
      shared->cv.wait(lock, [&] { return shared->quit || shared->posted; });
      if (shared->quit) return;
      r = shared->request;
    }
    Decision d;
    std::exception_ptr error;
    try {
      if (!connection.store) connection = connect();
      d = cast_vote(*connection.store, r.generation, r.members, r.step, r.stop, latest->load());
    } catch (...) {
      error = std::current_exception();
      connection = VoterConnection{};  // a reply later than the timeout closed it: the next vote opens another
    }
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      if (shared->stale) {  // the rank gave up on this one: it is not the answer to a later vote
        shared->stale = false;
        continue;
      }
      shared->posted = false;
      shared->answered = true;
      shared->decision = d;
      shared->error = error;
    }
    shared->cv.notify_all();
  }
}

}  // namespace crosstrain::elastic
