// Elastic membership's pure rules (membership_logic.h): the failure detector, the store records and their
// rejection of malformed input, and which replicas form the next generation.
#include <gtest/gtest.h>

#include <set>
#include <stdexcept>

#include "crosstrain/elastic/membership_logic.h"

using namespace crosstrain::elastic;
using std::chrono::milliseconds;

namespace {

const Clock::time_point t0 = Clock::time_point{} + std::chrono::hours(1);

std::string inc(int rank, int restart = 0) { return incarnation_of("host" + std::to_string(rank), 1000 + rank, restart); }

Registration reg(int rank, int replica, int replica_size, int restart = 0) {
  Registration r;
  r.rank = rank;
  r.replica = replica;
  r.replica_size = replica_size;
  r.incarnation = inc(rank, restart);
  return r;
}

// A job of `dp` replicas of pp x tp ranks, laid out as the mesh does: rank = (pp_i * dp + dp_i) * tp + tp_i.
std::map<int, Registration> layout(int dp, int pp = 1, int tp = 1) {
  std::map<int, Registration> out;
  for (int p = 0; p < pp; ++p)
    for (int d = 0; d < dp; ++d)
      for (int t = 0; t < tp; ++t) {
        const int rank = (p * dp + d) * tp + t;
        out[rank] = reg(rank, d, pp * tp);
      }
  return out;
}

MembershipView view_of(const std::map<int, Registration>& registered, int world_size, const Generation* current = nullptr) {
  MembershipView v;
  v.current = current;
  v.registered = registered;
  v.world_size = world_size;
  return v;
}

Generation first_of(const std::map<int, Registration>& registered, int world_size) {
  auto g = next_generation(view_of(registered, world_size), 1);
  if (!g) throw std::runtime_error("no first generation");
  return *g;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------------
// FailureDetector

TEST(MembershipFailureDetector, AliveWhileTheCounterMoves) {
  FailureDetector d(milliseconds(100));
  for (int i = 0; i < 20; ++i) {
    const auto now = t0 + milliseconds(80 * i);  // every beat is within the timeout of the last one
    d.observe(3, inc(3), i, now);
    EXPECT_FALSE(d.dead(3, inc(3), now + milliseconds(79))) << "beat " << i;
  }
  EXPECT_EQ(d.silent_for(3, t0 + milliseconds(80 * 19 + 30)).count(), 30);
}

TEST(MembershipFailureDetector, DeadAfterTheTimeoutWithoutMovement) {
  FailureDetector d(milliseconds(100));
  d.observe(0, inc(0), 7, t0);
  d.observe(0, inc(0), 7, t0 + milliseconds(60));   // read again, same value: no movement
  d.observe(0, inc(0), 7, t0 + milliseconds(100));
  EXPECT_FALSE(d.dead(0, inc(0), t0 + milliseconds(100)));
  EXPECT_TRUE(d.dead(0, inc(0), t0 + milliseconds(101)));
  EXPECT_EQ(d.silent_for(0, t0 + milliseconds(150)).count(), 150);
  // It moves again: alive.
  d.observe(0, inc(0), 8, t0 + milliseconds(150));
  EXPECT_FALSE(d.dead(0, inc(0), t0 + milliseconds(200)));
}

TEST(MembershipFailureDetector, TheTimeoutCanChange) {
  FailureDetector d(milliseconds(500));
  d.observe(0, inc(0), 1, t0);
  EXPECT_FALSE(d.dead(0, inc(0), t0 + milliseconds(200)));
  d.set_timeout(milliseconds(100));
  EXPECT_TRUE(d.dead(0, inc(0), t0 + milliseconds(200)));
}

TEST(MembershipFailureDetector, UnwatchedRankOrOtherIncarnationIsNotDead) {
  FailureDetector d(milliseconds(100));
  EXPECT_FALSE(d.dead(1, inc(1), t0 + std::chrono::hours(5)));
  EXPECT_EQ(d.silent_for(1, t0).count(), 0);
  d.observe(1, inc(1), 0, t0);
  EXPECT_TRUE(d.dead(1, inc(1), t0 + milliseconds(500)));
  EXPECT_FALSE(d.dead(1, inc(1, 1), t0 + milliseconds(500))) << "only the watched incarnation can be dead";
}

TEST(MembershipFailureDetector, NewIncarnationStartsFresh) {
  FailureDetector d(milliseconds(100));
  d.observe(2, inc(2), 50, t0);
  d.exited(2, 1002);
  EXPECT_TRUE(d.dead(2, inc(2), t0));
  // The restarted process: a lower counter value, or even the same one, must not matter; nor the old exit.
  const auto later = t0 + milliseconds(1000);
  d.observe(2, inc(2, 1), 50, later);
  EXPECT_FALSE(d.dead(2, inc(2, 1), later));
  EXPECT_FALSE(d.dead(2, inc(2, 1), later + milliseconds(100)));
  EXPECT_TRUE(d.dead(2, inc(2, 1), later + milliseconds(101))) << "its silence counts from its first observation";
  EXPECT_FALSE(d.dead(2, inc(2), later)) << "the old incarnation is no longer watched";
  EXPECT_EQ(d.silent_for(2, later + milliseconds(40)).count(), 40);
}

TEST(MembershipFailureDetector, ExitedMarksOnlyTheMatchingPidDead) {
  FailureDetector d(milliseconds(10000));
  d.observe(0, incarnation_of("a", 111, 5), 1, t0);
  d.observe(1, incarnation_of("a", 222, 5), 1, t0);
  d.exited(0, 999);  // some other process (an earlier incarnation's pid)
  EXPECT_FALSE(d.dead(0, incarnation_of("a", 111, 5), t0));
  d.exited(0, 222);  // rank 1's pid, reported for rank 0
  EXPECT_FALSE(d.dead(0, incarnation_of("a", 111, 5), t0));
  EXPECT_FALSE(d.dead(1, incarnation_of("a", 222, 5), t0));
  d.exited(7, 111);  // a rank never watched: no effect, no crash
  d.exited(0, 111);
  EXPECT_TRUE(d.dead(0, incarnation_of("a", 111, 5), t0)) << "dead at once, heartbeat or not";
  d.observe(0, incarnation_of("a", 111, 5), 2, t0 + milliseconds(1));
  EXPECT_TRUE(d.dead(0, incarnation_of("a", 111, 5), t0 + milliseconds(1))) << "a late beat does not revive it";
  EXPECT_FALSE(d.dead(1, incarnation_of("a", 222, 5), t0));
}

TEST(MembershipFailureDetector, HasExitedOnlyForTheReportedIncarnation) {
  FailureDetector d(milliseconds(100));
  d.observe(0, incarnation_of("a", 111, 5), 1, t0);
  EXPECT_FALSE(d.has_exited(0, incarnation_of("a", 111, 5)));
  d.observe(0, incarnation_of("a", 111, 5), 1, t0 + milliseconds(500));
  EXPECT_FALSE(d.has_exited(0, incarnation_of("a", 111, 5))) << "silent is not exited";
  d.exited(0, 111);
  EXPECT_TRUE(d.has_exited(0, incarnation_of("a", 111, 5)));
  EXPECT_FALSE(d.has_exited(0, incarnation_of("a", 112, 6)));
  EXPECT_FALSE(d.has_exited(1, incarnation_of("a", 111, 5)));
  d.observe(0, incarnation_of("a", 112, 6), 0, t0 + milliseconds(600));
  EXPECT_FALSE(d.has_exited(0, incarnation_of("a", 112, 6)));
}

// ---------------------------------------------------------------------------------------------------------------
// Records

TEST(MembershipRecords, IncarnationNamesItsPid) {
  EXPECT_EQ(pid_of_incarnation(incarnation_of("node-3.example", 4242, 1700000000000)), 4242);
  EXPECT_EQ(pid_of_incarnation("host"), -1);
  EXPECT_EQ(pid_of_incarnation("host/4242"), -1);
  EXPECT_EQ(pid_of_incarnation("host/abc/1"), -1);
  EXPECT_EQ(pid_of_incarnation(""), -1);
  EXPECT_NE(incarnation_of("h", 1, 2), incarnation_of("h", 1, 3));
}

TEST(MembershipRecords, RegistrationRoundTrips) {
  Registration r = reg(5, 2, 4, 17);
  r.timing.heartbeat_ms = 33;
  r.timing.failure_timeout_ms = 444;
  r.timing.min_replicas = 3;
  r.last_generation = 41;
  r.trained_in = 39;
  r.last_members = 6;
  const Registration back = decode_registration(encode_registration(r));
  EXPECT_EQ(back.last_generation, 41);
  EXPECT_EQ(back.trained_in, 39);
  EXPECT_EQ(back.last_members, 6);
  EXPECT_EQ(back.rank, 5);
  EXPECT_EQ(back.replica, 2);
  EXPECT_EQ(back.replica_size, 4);
  EXPECT_EQ(back.incarnation, r.incarnation);
  EXPECT_EQ(back.timing.heartbeat_ms, 33);
  EXPECT_EQ(back.timing.failure_timeout_ms, 444);
  EXPECT_EQ(back.timing.min_replicas, 3);
}

TEST(MembershipRecords, MalformedRegistrationRejected) {
  for (const std::string text :
       {"", "{", "not json", "null", "[]", "5", R"({"replica":0,"replica_size":1,"incarnation":"h/1/2"})",
        R"({"rank":0,"replica_size":1,"incarnation":"h/1/2"})", R"({"rank":0,"replica":0,"incarnation":"h/1/2"})",
        R"({"rank":0,"replica":0,"replica_size":1})", R"({"rank":"zero","replica":0,"replica_size":1,"incarnation":"x"})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":7})",
        R"({"rank":-1,"replica":0,"replica_size":1,"incarnation":"h/1/2"})",
        R"({"rank":0,"replica":-2,"replica_size":1,"incarnation":"h/1/2"})",
        R"({"rank":0,"replica":0,"replica_size":0,"incarnation":"h/1/2"})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","heartbeat_ms":"fast"})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","last_generation":-3})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","last_members":-1})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","last_generation":1099511627776})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","last_members":2000000})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","trained_in":-1})",
        R"({"rank":0,"replica":0,"replica_size":1,"incarnation":"h/1/2","last_generation":3,"trained_in":4})"})
    EXPECT_THROW(decode_registration(text), std::runtime_error) << text;
}

TEST(MembershipRecords, GenerationRoundTrips) {
  Generation g;
  g.id = 12;
  g.replicas = {0, 2};
  g.ranks = {0, 1, 4, 5};
  g.survivors = {2};
  g.incarnations = {{0, inc(0)}, {1, inc(1)}, {4, inc(4, 2)}, {5, inc(5)}};
  g.reason = "join";
  const Generation back = decode_generation(encode_generation(g));
  EXPECT_EQ(back.id, 12);
  EXPECT_EQ(back.replicas, g.replicas);
  EXPECT_EQ(back.ranks, g.ranks);
  EXPECT_EQ(back.survivors, g.survivors);
  EXPECT_EQ(back.incarnations, g.incarnations);
  EXPECT_EQ(back.reason, "join");
  EXPECT_FALSE(back.failure());
  EXPECT_EQ(back.index_of(4), 2);
  EXPECT_EQ(back.index_of(2), -1);
  EXPECT_TRUE(back.has_replica(2));
  EXPECT_FALSE(back.has_replica(1));
}

TEST(MembershipRecords, MalformedGenerationRejected) {
  const std::string ok =
      R"({"id":2,"replicas":[0,1],"ranks":[0,1],"survivors":[0],"incarnations":{"0":"a/1/1","1":"b/2/1"},"reason":"failure"})";
  EXPECT_NO_THROW(decode_generation(ok));
  for (const std::string text :
       {"", "[]", "null", "garbage", R"({"replicas":[0],"ranks":[0],"survivors":[],"incarnations":{},"reason":"start"})",
        R"({"id":1,"ranks":[0],"survivors":[],"incarnations":{},"reason":"start"})",
        R"({"id":1,"replicas":[0],"survivors":[],"incarnations":{},"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[0],"incarnations":{},"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[0],"survivors":[],"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[0],"survivors":[],"incarnations":{}})",
        R"({"id":1,"replicas":[0],"ranks":["a"],"survivors":[],"incarnations":{},"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[0],"survivors":[],"incarnations":{"x":"a/1/1"},"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[0],"survivors":[],"incarnations":{"0":5},"reason":"start"})",
        R"({"id":1,"replicas":[0],"ranks":[1,0],"survivors":[],"incarnations":{},"reason":"start"})",
        R"({"id":1,"replicas":[1,0],"ranks":[0,1],"survivors":[],"incarnations":{},"reason":"start"})"})
    EXPECT_THROW(decode_generation(text), std::runtime_error) << text;
}

TEST(MembershipRecords, DecisionRoundTrips) {
  for (const Decision d : {Decision{true, 0}, Decision{true, 7}, Decision{false, 3}, Decision{true, 0, true}}) {
    const Decision back = decode_decision(encode_decision(d));
    EXPECT_EQ(back.commit, d.commit);
    EXPECT_EQ(back.next_generation, d.next_generation);
    EXPECT_EQ(back.stop, d.stop);
  }
  EXPECT_EQ(encode_decision({false, 2}), "abort 2");
  EXPECT_EQ(encode_decision({true, 0}), "commit 0");
  EXPECT_EQ(encode_decision({true, 4, true}), "stop 4");  // commits, and is the job's last step
}

TEST(MembershipRecords, MalformedDecisionRejected) {
  for (const std::string text : {"", "commit", "abort", "stop", "commit ", "abort x", "stop x", "commit 1x", "commit 1 ",
                                 "yes 1", "Commit 1", "abort 0", "abort -3", "abort 99999999999999999999999"})
    EXPECT_THROW(decode_decision(text), std::runtime_error) << "'" << text << "'";
}

TEST(MembershipRecords, AccusationRoundTripsAndBoundsItsReason) {
  Accusation a;
  a.accused = 0;
  a.incarnation = incarnation_of("c1-h0", 4242, 1700000000000);
  a.why = "message 3 on tag 1056768 from rank 1 did not authenticate\nsecond line";
  const Accusation b = decode_accusation(encode_accusation(a));
  EXPECT_EQ(b.accused, 0);
  EXPECT_EQ(b.incarnation, a.incarnation);
  EXPECT_EQ(b.why, "message 3 on tag 1056768 from rank 1 did not authenticate second line");
  a.accused = 7;
  a.why = std::string(5000, 'x');
  const Accusation c = decode_accusation(encode_accusation(a));
  EXPECT_EQ(c.accused, 7);
  EXPECT_EQ(c.why.size(), kMaxAccusationWhy);
}

TEST(MembershipRecords, MalformedAccusationRejected) {
  const std::string inc = incarnation_of("h", 12, 5);
  const std::vector<std::string> texts = {"", "1", "1 " + inc, "x " + inc + "\nwhy", "-1 " + inc + "\nwhy", "1 \nwhy",
                                         "1 nopid\nwhy", "99999999 " + inc + "\nwhy",
                                         "1 " + inc + "\n" + std::string(kMaxAccusationWhy + 1, 'y')};
  for (const std::string& text : texts)
    EXPECT_THROW(decode_accusation(text), std::runtime_error) << "'" << text.substr(0, 60) << "'";
}

TEST(MembershipRecords, KeysAreDistinctAndUnderElastic) {
  const std::set<std::string> keys = {registration_key(1), heartbeat_key(1),  generation_key(1),
                                      latest_generation_key(), vote_key(1, 1), decision_key(1, 1),
                                      start_key(1),            vote_key(1, 11), vote_key(11, 1),
                                      accusation_key(1, 11),   accusation_key(11, 1), accusations_key()};
  EXPECT_EQ(keys.size(), 12u);
  for (const auto& k : keys) EXPECT_EQ(k.rfind("elastic/", 0), 0u) << k;
}

// ---------------------------------------------------------------------------------------------------------------
// next_generation

TEST(MembershipNextGeneration, FirstWaitsForEveryRank) {
  auto all = layout(4);
  auto some = all;
  some.erase(3);
  EXPECT_FALSE(next_generation(view_of({}, 4), 1));
  EXPECT_FALSE(next_generation(view_of(some, 4), 1)) << "3 of 4 replicas, settle time not over";
  const auto g = next_generation(view_of(all, 4), 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->id, 1);
  EXPECT_EQ(g->reason, "start");
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g->replicas, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_TRUE(g->survivors.empty());
  EXPECT_EQ(g->incarnations.size(), 4u);
  EXPECT_EQ(g->incarnations.at(2), inc(2));
}

TEST(MembershipNextGeneration, FirstStartsWithMinReplicasOnceSettled) {
  auto regs = layout(4);
  regs.erase(1);
  regs.erase(3);
  auto v = view_of(regs, 4);
  v.settle_elapsed = true;
  EXPECT_FALSE(next_generation(v, 3)) << "2 replicas, min_replicas 3";
  const auto g = next_generation(v, 2);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->id, 1);
  EXPECT_EQ(g->reason, "start");
  EXPECT_EQ(g->replicas, (std::vector<int>{0, 2}));
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 2}));
}

TEST(MembershipNextGeneration, FirstLeavesOutDeadAndIncompleteReplicas) {
  auto regs = layout(2, 2);  // replica 0: ranks 0, 2; replica 1: ranks 1, 3
  regs.erase(3);             // replica 1 incomplete
  auto v = view_of(regs, 4);
  EXPECT_FALSE(next_generation(v, 1));
  v.settle_elapsed = true;
  auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->replicas, (std::vector<int>{0}));
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 2}));
  v.dead = {2};
  EXPECT_FALSE(next_generation(v, 1)) << "the only complete replica has a dead rank";
}

TEST(MembershipNextGeneration, NothingChangesNoGeneration) {
  const auto regs = layout(4);
  const Generation g1 = first_of(regs, 4);
  auto v = view_of(regs, 4, &g1);
  v.settle_elapsed = true;
  EXPECT_FALSE(next_generation(v, 1));
  EXPECT_FALSE(next_generation(v, 4));
}

TEST(MembershipNextGeneration, DeadRankRemovesItsReplica) {
  const auto regs = layout(4);
  const Generation g1 = first_of(regs, 4);
  auto v = view_of(regs, 4, &g1);
  v.dead = {2};
  const auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->id, 2);
  EXPECT_EQ(g->reason, "failure");
  EXPECT_TRUE(g->failure());
  EXPECT_EQ(g->replicas, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g->survivors, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g->incarnations.count(2), 0u);
  EXPECT_EQ(g->index_of(3), 2) << "new rank of world rank 3";
}

TEST(MembershipNextGeneration, FailureIsPublishedEvenBelowMinReplicas) {
  const auto regs = layout(2);
  const Generation g1 = first_of(regs, 2);
  auto v = view_of(regs, 2, &g1);
  v.dead = {0};
  const auto g = next_generation(v, 2);
  ASSERT_TRUE(g) << "losing replicas cannot wait for joins";
  EXPECT_EQ(g->reason, "failure");
  EXPECT_EQ(g->ranks, (std::vector<int>{1}));
}

// Replica 2 restarted and a join generation was published for it; before that join started, replica 1 died.
// The failure generation is made of the survivors that hold the state; the joiner comes back in a later join, so
// the survivors never wait for it (a slow or dying joiner in a failure generation stalled them for seconds).
TEST(MembershipNextGeneration, AFailureLeavesOutAJoinerThatHoldsNoStateYet) {
  auto regs = layout(3);
  const Generation g1 = first_of(regs, 3);
  regs[2] = reg(2, 2, 1, 1);
  auto v = view_of(regs, 3, &g1);
  v.dead = {};
  const auto failure = next_generation(v, 1);  // the old rank 2 was replaced: a failure of 2 replicas
  ASSERT_TRUE(failure);
  const auto join = next_generation(view_of(regs, 3, &*failure), 1);
  ASSERT_TRUE(join);
  ASSERT_EQ(join->reason, "join");
  ASSERT_EQ(join->replicas, (std::vector<int>{0, 1, 2}));
  v = view_of(regs, 3, &*join);
  v.holders = &*failure;  // the join has not started
  v.dead = {1};
  const auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->reason, "failure");
  EXPECT_EQ(g->replicas, (std::vector<int>{0}));
  EXPECT_EQ(g->ranks, (std::vector<int>{0}));
  EXPECT_EQ(g->survivors, (std::vector<int>{0}));
  EXPECT_EQ(g->incarnations.count(2), 0u);
  // Once the join started, the healed joiner holds the state too and stays.
  v.holders = &*join;
  const auto after_start = next_generation(v, 1);
  ASSERT_TRUE(after_start);
  EXPECT_EQ(after_start->replicas, (std::vector<int>{0, 2}));
  // The next tick, with the failure generation current, admits the joiner in a join of its own.
  auto next_tick = view_of(regs, 3, &*g);
  next_tick.dead = {1};
  const auto rejoin = next_generation(next_tick, 1);
  ASSERT_TRUE(rejoin);
  EXPECT_EQ(rejoin->reason, "join");
  EXPECT_EQ(rejoin->replicas, (std::vector<int>{0, 2}));
}

TEST(MembershipNextGeneration, ReplacedIncarnationCountsAsLost) {
  auto regs = layout(4);
  const Generation g1 = first_of(regs, 4);
  regs[1] = reg(1, 1, 1, /*restart=*/1);  // rank 1 restarted before its old process was seen dead
  auto v = view_of(regs, 4, &g1);
  const auto g2 = next_generation(v, 1);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->reason, "failure");
  EXPECT_EQ(g2->replicas, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(g2->survivors, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(g2->index_of(1), -1);
  // Then the restarted process, a complete replica of its own, joins: not a survivor (it holds no live state).
  auto v3 = view_of(regs, 4, &*g2);
  const auto g3 = next_generation(v3, 1);
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->id, 3);
  EXPECT_EQ(g3->reason, "join");
  EXPECT_FALSE(g3->failure());
  EXPECT_EQ(g3->replicas, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g3->survivors, (std::vector<int>{0, 2, 3}));
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g3->incarnations.at(1), inc(1, 1));
  // And then nothing more.
  auto v4 = view_of(regs, 4, &*g3);
  EXPECT_FALSE(next_generation(v4, 1));
}

TEST(MembershipNextGeneration, DeadAndReplacedAtOnce) {
  auto regs = layout(4);
  const Generation g1 = first_of(regs, 4);
  regs[0] = reg(0, 0, 1, 1);
  auto v = view_of(regs, 4, &g1);
  v.dead = {3};
  const auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->reason, "failure") << "a loss and a join in one generation is a failure";
  EXPECT_EQ(g->survivors, (std::vector<int>{1, 2}));
  EXPECT_EQ(g->replicas, (std::vector<int>{1, 2})) << "the replaced member leaves first; it joins next time";
  auto v3 = view_of(regs, 4, &*g);
  v3.dead = {3};
  const auto g3 = next_generation(v3, 1);
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->replicas, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(g3->incarnations.at(0), inc(0, 1));
}

TEST(MembershipNextGeneration, IncompleteReplicaDoesNotJoin) {
  // 2 replicas of pp=2: replica 0 = ranks {0, 2}, replica 1 = ranks {1, 3}.
  auto regs = layout(2, 2);
  const Generation g1 = first_of(regs, 4);
  auto v = view_of(regs, 4, &g1);
  v.dead = {3};
  const auto g2 = next_generation(v, 1);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->ranks, (std::vector<int>{0, 2}));
  // Replica 1's rank 3 restarts first: 1 of its 2 ranks has a live new process, rank 1 is the old (left) one, now dead.
  regs[3] = reg(3, 1, 2, 1);
  auto v3 = view_of(regs, 4, &*g2);
  v3.dead = {1};
  EXPECT_FALSE(next_generation(v3, 1)) << "rank 1 is dead: replica 1 is not complete";
  regs.erase(1);  // (or not registered at all)
  auto v3b = view_of(regs, 4, &*g2);
  EXPECT_FALSE(next_generation(v3b, 1)) << "2 of 2 ranks needed, 1 registered";
  // Rank 1 restarts too: the replica joins.
  regs[1] = reg(1, 1, 2, 1);
  auto v4 = view_of(regs, 4, &*g2);
  const auto g3 = next_generation(v4, 1);
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g3->survivors, (std::vector<int>{0}));
}

TEST(MembershipNextGeneration, JoinWaitsForMinReplicas) {
  auto regs = layout(3);
  const Generation g1 = first_of(regs, 3);
  auto v = view_of(regs, 3, &g1);
  v.dead = {1, 2};
  const auto g2 = next_generation(v, 3);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->ranks, (std::vector<int>{0}));
  regs[1] = reg(1, 1, 1, 1);
  auto v3 = view_of(regs, 3, &*g2);
  v3.dead = {2};
  EXPECT_FALSE(next_generation(v3, 3)) << "2 replicas could train, 3 required";
  const auto g3 = next_generation(v3, 2);
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1}));
}

TEST(MembershipNextGeneration, PipelineLayoutReplicaRanksAreNotConsecutive) {
  // dp=2, pp=2, tp=2: rank = (pp_i*2 + dp_i)*2 + tp_i; replica 0 = {0,1,4,5}, replica 1 = {2,3,6,7}.
  auto regs = layout(2, 2, 2);
  ASSERT_EQ(regs.at(5).replica, 0);
  ASSERT_EQ(regs.at(6).replica, 1);
  ASSERT_EQ(regs.at(6).replica_size, 4);
  auto partial = regs;
  partial.erase(7);
  EXPECT_FALSE(next_generation(view_of(partial, 8), 1));
  const Generation g1 = first_of(regs, 8);
  EXPECT_EQ(g1.ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(g1.replicas, (std::vector<int>{0, 1}));

  auto v = view_of(regs, 8, &g1);
  v.dead = {5};
  const auto g2 = next_generation(v, 1);
  ASSERT_TRUE(g2);
  EXPECT_EQ(g2->reason, "failure");
  EXPECT_EQ(g2->replicas, (std::vector<int>{1}));
  EXPECT_EQ(g2->survivors, (std::vector<int>{1}));
  EXPECT_EQ(g2->ranks, (std::vector<int>{2, 3, 6, 7}));
  EXPECT_EQ(g2->index_of(6), 2);

  // Replica 0 comes back, every rank restarted (in descending order of registration: the output is still sorted).
  for (int rank : {5, 4, 1, 0}) regs[rank] = reg(rank, 0, 4, 1);
  auto v3 = view_of(regs, 8, &*g2);
  const auto g3 = next_generation(v3, 1);
  ASSERT_TRUE(g3);
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->replicas, (std::vector<int>{0, 1}));
  EXPECT_EQ(g3->survivors, (std::vector<int>{1}));
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  for (int rank : {0, 1, 4, 5}) EXPECT_EQ(g3->incarnations.at(rank), inc(rank, 1));
  for (int rank : {2, 3, 6, 7}) EXPECT_EQ(g3->incarnations.at(rank), inc(rank));
}

TEST(MembershipNextGeneration, ReplicaSizeMismatchIsIncomplete) {
  // Two ranks claim replica 0 but each says the replica has 3 ranks: never complete.
  std::map<int, Registration> regs{{0, reg(0, 0, 3)}, {1, reg(1, 0, 3)}, {2, reg(2, 1, 1)}};
  auto v = view_of(regs, 3);
  EXPECT_FALSE(next_generation(v, 1));
  v.settle_elapsed = true;
  const auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->ranks, (std::vector<int>{2}));
}

// --nnodes MIN:MAX: after the settle time the first generation still waits for MIN nodes' ranks.
TEST(MembershipNextGeneration, FirstGenerationWaitsForTheMinimumRanksAfterSettling) {
  auto all = layout(4);
  std::map<int, Registration> one_node{{0, all.at(0)}, {1, all.at(1)}};
  MembershipView v = view_of(one_node, 4);
  v.settle_elapsed = true;
  v.min_start_ranks = 4;  // --nnodes 2:2 with 2 ranks a node
  EXPECT_FALSE(next_generation(v, 1).has_value());
  v.min_start_ranks = 2;  // --nnodes 1:2
  auto g = next_generation(v, 1);
  ASSERT_TRUE(g.has_value());
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1}));
}

// A standby's first generation: numbered above every generation any registrant knew, and only with a majority of
// the members of the newest generation one of them started, counting only those that started it.
TEST(MembershipTakeover, NumbersAboveEveryKnownGenerationAndNeedsAMajorityOfTheLastMembers) {
  auto regs = layout(6);
  for (auto& [rank, r] : regs) r.last_generation = 7, r.trained_in = 7, r.last_members = 5;
  regs[2].last_generation = 9;  // knew of a join published but not started: it trained in 7 with the others
  regs[4].last_generation = 0;  // a fresh process: knows nothing
  regs[4].trained_in = 0;
  regs[4].last_members = 0;
  Takeover t = takeover_quorum(regs, 6);
  EXPECT_EQ(t.first_id, 10);
  EXPECT_EQ(t.reference, 7);
  EXPECT_EQ(t.min_ranks, 3);  // 5 members: 3 make a majority
  regs[3].trained_in = 8;  // started a newer generation of 4 (7's others did not reach it): 8 decides
  regs[3].last_generation = 8;
  regs[3].last_members = 4;
  t = takeover_quorum(regs, 6);
  EXPECT_EQ(t.reference, 8);
  EXPECT_EQ(t.min_ranks, 3) << "2 of 4 is a tie: the primary's side keeps the job";
  EXPECT_EQ(takeover_quorum({}, 6).first_id, 1);
  EXPECT_EQ(takeover_quorum({}, 6).reference, 0);
  EXPECT_EQ(takeover_quorum({}, 6).min_ranks, 6) << "nobody started a generation: every rank of the job";

  // The standby's first generation starts with the quorum after the settle time, under its own first id; only the
  // reference generation's starters are votes.
  auto v = view_of({{1, reg(1, 1, 1)}, {2, reg(2, 2, 1)}}, 6);
  for (auto& [rank, r] : v.registered) r.trained_in = 7, r.last_generation = 7, r.last_members = 5;
  v.first_id = 10;
  v.quorum_generation = 7;
  v.quorum_min = 3;
  v.settle_elapsed = true;
  EXPECT_FALSE(next_generation(v, 1)) << "2 ranks of a quorum of 3";
  v.registered[5] = reg(5, 5, 1);  // a fresh process (node 0 come back, say): it did not start 7
  EXPECT_FALSE(next_generation(v, 1)) << "a process that never started 7 is no vote";
  v.registered[4] = reg(4, 4, 1);
  v.registered[4].trained_in = 6;  // left before 7
  EXPECT_FALSE(next_generation(v, 1)) << "nor one that started only an older generation";
  v.registered[3] = reg(3, 3, 1);
  v.registered[3].trained_in = 7;
  const auto g = next_generation(v, 1);
  ASSERT_TRUE(g);
  EXPECT_EQ(g->id, 10);
  EXPECT_EQ(g->ranks, (std::vector<int>{1, 2, 3, 4, 5}));
}

WindowGeneration wg(int64_t id, std::vector<int> ranks, bool committed) {
  WindowGeneration g;
  g.id = id;
  for (int r : ranks) g.incarnations[r] = "p" + std::to_string(r);
  g.committed = committed;
  return g;
}

// The primary's side: the failure generation's members (the processes the window listed), and ranks restarted here
// after their listed process's exit was reported here.
bool primary_holds(const std::vector<WindowGeneration>& window, std::set<int> members, std::set<int> restarted,
                   int world) {
  const auto holds = [&](int rank, const std::string&) { return members.count(rank) + restarted.count(rank) > 0; };
  return primary_keeps_quorum(window, holds, static_cast<int>(members.size()), world);
}

// The primary's quorum window: the newest committed generation and every one started after it.
TEST(MembershipTakeover, TheQuorumWindowHoldsTheNewestCommittedGenerationAndEveryOneStartedAfter) {
  std::vector<WindowGeneration> w;
  widen_window(w, wg(1, {0, 1, 2}, false));
  widen_window(w, wg(1, {0, 1, 2}, false));  // once
  widen_window(w, wg(3, {0, 1, 2, 3, 4}, false));
  ASSERT_EQ(w.size(), 2u);
  commit_in_window(w, 1);
  ASSERT_EQ(w.size(), 2u) << "a committed generation stays, and the ones started after it";
  commit_in_window(w, 3);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].id, 3);
  EXPECT_TRUE(w[0].committed);
}

// Both sides of a cut, in the histories reviews found: at most one side may train on, and (where the ranks are all
// there) one does. `standby` are the ranks that went over, each with the generation it started and its size.
struct Side {
  int rank;
  int64_t trained_in;
  int members;
};
bool standby_takes_over(const std::vector<Side>& standby, int world) {
  std::map<int, Registration> regs;
  for (const Side& s : standby) {
    Registration r = reg(s.rank, s.rank, 1);
    r.trained_in = r.last_generation = s.trained_in;
    r.last_members = s.members;
    regs[s.rank] = r;
  }
  const Takeover t = takeover_quorum(regs, world);
  int votes = 0;
  for (const auto& [rank, r] : regs) votes += r.trained_in == t.reference;
  return votes >= t.min_ranks;
}

TEST(MembershipTakeover, NoHistoryLetsBothSidesOfACutTrainOn) {
  // Committed {0,1,2}, then a join of {0,1,2,3,4} that 0, 3 and 4 started before the cut left 1 and 2 behind.
  std::vector<WindowGeneration> w{wg(1, {0, 1, 2}, true), wg(2, {0, 1, 2, 3, 4}, false)};
  EXPECT_FALSE(primary_holds(w, {0, 3, 4}, {}, 5)) << "1 of the committed generation's 3";
  EXPECT_TRUE(standby_takes_over({{1, 1, 3}, {2, 1, 3}}, 5));
  // Committed {0,1}; a join {0,1,2} published but not started; cut {0} | {1, 2 (new)}: a tie stays with 0.
  w = {wg(2, {0, 1}, true)};
  EXPECT_TRUE(primary_holds(w, {0}, {}, 3));
  EXPECT_FALSE(standby_takes_over({{1, 2, 2}, {2, 0, 0}}, 3)) << "the joiner never started a generation";
  // Nothing started yet: the members against the job's ranks; the standby needs every rank.
  EXPECT_FALSE(primary_holds({}, {0}, {}, 3));
  EXPECT_FALSE(standby_takes_over({{1, 0, 0}, {2, 0, 0}}, 3));
  EXPECT_TRUE(standby_takes_over({{0, 0, 0}, {1, 0, 0}, {2, 0, 0}}, 3));
  // A failure generation of 5 that started after 6 committed: the cut side voted in 6 only.
  w = {wg(1, {0, 1, 2, 3, 4, 5}, true), wg(2, {0, 1, 2, 3, 4}, false)};
  EXPECT_FALSE(primary_holds(w, {0, 1}, {}, 6));
  EXPECT_TRUE(standby_takes_over({{2, 2, 5}, {3, 2, 5}, {4, 2, 5}}, 6));
  EXPECT_TRUE(primary_holds(w, {0, 1, 2}, {}, 6)) << "3 of 6 and 3 of 5";
  EXPECT_FALSE(standby_takes_over({{3, 2, 5}, {4, 2, 5}, {5, 1, 6}}, 6)) << "2 of 5 started the newest";
  // Ranks whose processes exited here and came back here are on this side: more than half lost to crashes, not to
  // a cut, does not stop the job. (A rank alive but not a member, or restarted without its exit known here, is
  // not counted: ElasticCoordinator.WithAStandby...)
  EXPECT_TRUE(primary_holds({wg(1, {0, 1, 2}, true)}, {0}, {1, 2}, 3));
  EXPECT_FALSE(primary_holds({wg(1, {0, 1, 2}, true)}, {0}, {}, 3));
  // Every split of one committed generation of 6: exactly one side goes on.
  for (int cut = 0; cut <= 6; ++cut) {
    std::set<int> primary;
    std::vector<Side> standby;
    for (int r = 0; r < 6; ++r)
      if (r < cut) primary.insert(r);
      else standby.push_back({r, 1, 6});
    const bool p = primary_holds({wg(1, {0, 1, 2, 3, 4, 5}, true)}, primary, {}, 6);
    const bool s = standby_takes_over(standby, 6);
    EXPECT_NE(p, s) << cut << " ranks stay with the primary";
  }
}

TEST(ElasticLogTime, ReadsAsUtcWithMillisecondsAndBack) {
  // 2026-12-06 09:14:44.123 UTC: 20,793 days after the epoch.
  const int64_t ms = (20793LL * 86400 + 9 * 3600 + 14 * 60 + 44) * 1000 + 123;
  EXPECT_EQ(log_time(ms), "2026-12-06T09:14:44.123Z");
  EXPECT_EQ(parse_log_time("2026-12-06T09:14:44.123Z"), ms);
  EXPECT_EQ(log_time(7), "1970-01-01T00:00:00.007Z");
  const int64_t now = unix_ms();
  EXPECT_EQ(parse_log_time(log_time(now)), now);
  for (const char* bad : {"1765012484123", "2026-12-06 09:14:44.123Z", "2026-12-06T09:14:44.123", "", "t=5"})
    EXPECT_THROW(parse_log_time(bad), std::runtime_error) << bad;
}

// What a launcher or the coordinator wrote into the store is read back as a pid only when it is one: anything
// else (a hostile or truncated value) names no process, so nothing gets killed for it.
TEST(MembershipKeys, APidFromTheStoreIsAPositiveDecimalOrNothing) {
  EXPECT_EQ(parse_pid("4242"), 4242);
  for (const char* bad : {"", "0", "-1", "12a", " 12", "1e3", "99999999999", "4242\n"})
    EXPECT_EQ(parse_pid(bad), -1) << "'" << bad << "'";
  EXPECT_NE(exited_key(3), exclude_key(3));
  EXPECT_EQ(exited_key(3).rfind("elastic/", 0), 0u);
}
