// Votes posted to the voter's thread (step_voter.h) against an in-process store: the last of a step's voters
// commits it, and the others read that decision; a vote the coordinator closed reads its abort; one vote at a time.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/elastic/step_voter.h"
#include "crosstrain/store/local_store.h"
#include "crosstrain/store/table.h"

using namespace crosstrain::elastic;
using crosstrain::comm::store::LocalStore;
using crosstrain::comm::store::StoreTable;
using std::chrono::milliseconds;

namespace {

constexpr milliseconds kAnswer{10000};

struct Stores {
  std::shared_ptr<StoreTable> table = std::make_shared<StoreTable>();
  std::shared_ptr<std::atomic<int64_t>> latest = std::make_shared<std::atomic<int64_t>>(1);
  int connections = 0;
  StepVoter::Connect connect() {
    return [this] {
      ++connections;
      return VoterConnection{c10::make_intrusive<LocalStore>(table, "test", 0, milliseconds(2000)), nullptr};
    };
  }
  c10::intrusive_ptr<c10d::Store> store() { return c10::make_intrusive<LocalStore>(table, "test", 0, milliseconds(2000)); }
};

}  // namespace

TEST(StepVoter, TheLastOfAStepsVotersCommitsItForEveryone) {
  Stores s;
  StepVoter a(s.connect(), s.latest, kAnswer, 0), b(s.connect(), s.latest, kAnswer, 1);
  a.post(/*generation=*/1, /*members=*/2, /*step=*/7, /*stop=*/false);
  EXPECT_TRUE(a.pending());
  std::this_thread::sleep_for(milliseconds(50));
  EXPECT_TRUE(a.pending());  // its decision waits for the second vote
  *s.latest = 3;             // a generation published before the last vote: everyone switches after the step
  b.post(1, 2, 7, false);
  const Decision da = a.result(), db = b.result();
  EXPECT_TRUE(da.commit);
  EXPECT_TRUE(db.commit);
  EXPECT_EQ(da.next_generation, 3);
  EXPECT_EQ(db.next_generation, 3);
  EXPECT_FALSE(a.pending());
  EXPECT_EQ(decode_decision(from_bytes(s.store()->get(decision_key(1, 7)))).next_generation, 3);
  // The next step on the same connections.
  a.post(1, 2, 8, /*stop=*/true);
  b.post(1, 2, 8, false);
  EXPECT_TRUE(a.result().stop);
  EXPECT_TRUE(b.result().stop);
  EXPECT_EQ(s.connections, 2);
}

TEST(StepVoter, AVoteTheCoordinatorClosedReadsItsAbort) {
  Stores s;
  StepVoter a(s.connect(), s.latest, kAnswer, 0);
  a.post(4, 3, 12, false);
  // A member died before its vote: the coordinator poisons the count and writes the abort.
  s.store()->add(vote_key(4, 12), kPoison);
  s.store()->set(decision_key(4, 12), to_bytes(encode_decision({false, 5})));
  const Decision d = a.result();
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.next_generation, 5);
}

// The last voter and the coordinator closing the generation may both write a committed step's decision (the
// coordinator does when the last voter might have died between its vote and its write): the first write stands,
// and the last voter returns that one, so every member reads the same.
TEST(StepVoter, TheLastVoterReturnsTheDecisionTheCoordinatorWroteFirst) {
  Stores s;
  s.store()->add(vote_key(2, 9), 1);  // the other member voted
  Decision written;
  written.commit = true;
  written.next_generation = 6;  // the coordinator closed generation 2 for 6 after the count was full
  s.store()->set(decision_key(2, 9), to_bytes(encode_decision(written)));
  StepVoter last(s.connect(), s.latest, kAnswer, 1);
  last.post(2, 2, 9, false);
  const Decision d = last.result();
  EXPECT_TRUE(d.commit);
  EXPECT_EQ(d.next_generation, 6);
}

TEST(StepVoter, AStoreThatNeverAnswersIsAnErrorAndTheNextVoteReconnects) {
  Stores s;
  StepVoter a(s.connect(), s.latest, kAnswer, 0);
  a.post(1, 2, 1, false);  // nobody else votes: the store's get times out (2 s)
  EXPECT_THROW(a.result(), std::exception);
  EXPECT_FALSE(a.pending());
  s.store()->set(decision_key(1, 2), to_bytes(encode_decision({true, 0})));
  a.post(1, 2, 2, false);
  EXPECT_TRUE(a.result().commit);
  EXPECT_EQ(s.connections, 2);
}

TEST(StepVoter, OneVoteAtATime) {
  Stores s;
  StepVoter a(s.connect(), s.latest, kAnswer, 0);
  EXPECT_THROW(a.result(), crosstrain::Error);  // nothing posted
  a.post(1, 2, 1, false);
  EXPECT_THROW(a.post(1, 2, 2, false), crosstrain::Error);
  s.store()->set(decision_key(1, 1), to_bytes(encode_decision({true, 0})));  // the other member's vote decided it
  EXPECT_TRUE(a.result().commit);
}

// A voter thread stuck in a call that never returns (here: its connection never opens) does not hold the rank:
// result() gives up after answer_within, naming the rank, the operation and the step; a later vote still works
// once the thread is free, and the stuck vote's late answer is not taken for it.
TEST(StepVoter, AStuckVoterThreadIsGivenUpOnNamingRankAndStep) {
  Stores s;
  std::atomic<int> calls{0};
  StepVoter::Connect slow = [&s, &calls] {
    if (calls++ == 0) std::this_thread::sleep_for(milliseconds(1500));
    return VoterConnection{s.store(), nullptr};
  };
  StepVoter a(slow, s.latest, milliseconds(300), 5);
  a.post(2, 1, 9, false);
  try {
    a.result();
    FAIL() << "no error";
  } catch (const crosstrain::CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 5"), std::string::npos) << what;
    EXPECT_NE(what.find("vote"), std::string::npos) << what;
    EXPECT_NE(what.find("step 9"), std::string::npos) << what;
  }
  EXPECT_FALSE(a.pending());
  std::this_thread::sleep_for(milliseconds(1500));  // the thread finishes the stuck vote (its answer is dropped)
  a.post(2, 1, 10, false);  // one member: this vote commits at once, once the thread is back
  const Decision d = a.result();
  EXPECT_TRUE(d.commit);
  EXPECT_EQ(decode_decision(from_bytes(s.store()->get(decision_key(2, 10)))).commit, true);
}
