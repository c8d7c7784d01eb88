// The elastic coordinator (coordinator.h) against an in-process store: the test plays the ranks (registrations,
// heartbeats, step votes) and checks the generations, exclusions and step decisions it publishes.
#include <gtest/gtest.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "crosstrain/store/local_store.h"
#include "crosstrain/store/table.h"
#include "crosstrain/elastic/coordinator.h"

using namespace crosstrain::elastic;
using crosstrain::comm::store::LocalStore;
using crosstrain::comm::store::StoreTable;
using std::chrono::milliseconds;

namespace {

// The processes of the job as the test plays them: each rank's incarnation, its heartbeat (a thread bumps every
// beating rank's counter every 20 ms), and what the coordinator told the launcher.
class Job {
 public:
  using Processes = std::vector<std::pair<int, int>>;  // (rank, pid)
  Job(int world_size, int replica_size, int failure_timeout_ms, milliseconds settle = milliseconds(3000),
      bool quorum = false)
      : world_size_(world_size), replica_size_(replica_size) {
    timing_.heartbeat_ms = 20;
    timing_.failure_timeout_ms = failure_timeout_ms;
    timing_.min_replicas = 1;
    beat_ = std::thread([this] {
      while (!stop_) {
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (int rank : beating_) table_->add(heartbeat_key(rank), 1);
        }
        std::this_thread::sleep_for(milliseconds(timing_.heartbeat_ms));
      }
    });
    CoordinatorOptions options;
    options.world_size = world_size;
    options.settle = settle;
    options.quorum = quorum;  // a standby exists elsewhere (crosstrain run --standby)
    options.exclude = [this](const std::vector<std::pair<int, int>>& processes, const std::string& why) {
      std::lock_guard<std::mutex> lock(mu_);
      excluded_.push_back({processes, why});
    };
    options.log = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mu_);
      log_.push_back(line);
    };
    coordinator_ = std::make_unique<Coordinator>(store_, options);
  }
  ~Job() {
    coordinator_.reset();
    stop_ = true;
    beat_.join();
  }

  Coordinator& coordinator() { return *coordinator_; }
  StoreTable& table() { return *table_; }
  c10d::Store& store() { return *store_; }

  // Replica = dp index with pp x tp = replica_size ranks laid out as rank = pp_i * dp + dp_i (tp 1).
  int replica_of(int rank) const { return rank % (world_size_ / replica_size_); }
  static int pid_of(int rank, int restart) { return 10000 + 100 * restart + rank; }
  static std::string incarnation(int rank, int restart) {
    return incarnation_of("host" + std::to_string(rank), pid_of(rank, restart), 1000 + restart);
  }

  // The rank's process `restart` registers and starts beating.
  void start_rank(int rank, int restart = 0) {
    Registration r;
    r.rank = rank;
    r.replica = replica_of(rank);
    r.replica_size = replica_size_;
    r.incarnation = incarnation(rank, restart);
    r.timing = timing_;
    store_->set(registration_key(rank), bytes(encode_registration(r)));
    store_->add(roster_key(), 1);
    std::lock_guard<std::mutex> lock(mu_);
    beating_.insert(rank);
  }
  void start_all() {
    for (int rank = 0; rank < world_size_; ++rank) start_rank(rank);
  }
  void stop_beating(int rank) { stop_beating({rank}); }
  void stop_beating(std::initializer_list<int> ranks) {  // at once: no beat of one after another stopped
    std::lock_guard<std::mutex> lock(mu_);
    for (int rank : ranks) beating_.erase(rank);
  }

  // The value at `key` once it is there (polling the table), or nullopt after `timeout`.
  std::optional<std::string> wait_key(const std::string& key, milliseconds timeout = milliseconds(1500)) {
    return table_->wait_get(key, StoreTable::Clock::now() + timeout);
  }
  std::optional<Generation> wait_generation(int64_t id, milliseconds timeout = milliseconds(1500)) {
    auto text = wait_key(generation_key(id), timeout);
    if (!text) return std::nullopt;
    return decode_generation(*text);
  }

  // What exclude was told so far, once it was told at least `count` times (publish calls it last), or after
  // `timeout`.
  std::vector<std::pair<Processes, std::string>> excluded(size_t count = 0, milliseconds timeout = milliseconds(1000)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (excluded_.size() >= count || std::chrono::steady_clock::now() >= deadline) return excluded_;
      }
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  std::string log() {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out;
    for (const auto& line : log_) out += line + "\n";
    return out;
  }

  static std::vector<uint8_t> bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

 private:
  int world_size_, replica_size_;
  Timing timing_;
  std::shared_ptr<StoreTable> table_ = std::make_shared<StoreTable>();
  c10::intrusive_ptr<c10d::Store> store_ = c10::make_intrusive<LocalStore>(table_, "test", 0, milliseconds(5000));
  std::mutex mu_;
  std::set<int> beating_;
  std::vector<std::pair<Processes, std::string>> excluded_;
  std::vector<std::string> log_;
  std::atomic<bool> stop_{false};
  std::thread beat_;
  std::unique_ptr<Coordinator> coordinator_;
};

using Ms = std::chrono::duration<double, std::milli>;

}  // namespace

TEST(ElasticCoordinator, FirstGenerationHasEveryRank) {
  Job job(4, 1, 500);
  job.start_rank(0);
  job.start_rank(2);
  EXPECT_FALSE(job.wait_generation(1, milliseconds(150))) << "2 of 4 ranks registered, settle time not over";
  EXPECT_EQ(job.coordinator().generation(), 0);
  job.start_rank(1);
  job.start_rank(3);
  const auto g = job.wait_generation(1);
  ASSERT_TRUE(g) << job.log();
  EXPECT_EQ(g->reason, "start");
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g->replicas, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g->incarnations.at(3), Job::incarnation(3, 0));
  // Everyone beats: nothing more happens.
  EXPECT_FALSE(job.wait_generation(2, milliseconds(300))) << job.log();
  EXPECT_EQ(*job.table().get(latest_generation_key()), "1");
  EXPECT_EQ(job.coordinator().generation(), 1);
  EXPECT_TRUE(job.excluded().empty());
}

TEST(ElasticCoordinator, FirstGenerationWithFewerRanksOnceSettled) {
  Job job(4, 1, 500, milliseconds(200));
  job.start_rank(0);
  job.start_rank(3);
  const auto start = std::chrono::steady_clock::now();
  const auto g = job.wait_generation(1);
  ASSERT_TRUE(g) << job.log();
  EXPECT_GE(Ms(std::chrono::steady_clock::now() - start).count(), 150) << "published before the settle time";
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 3}));
  // The missing ranks join later.
  job.start_rank(1);
  job.start_rank(2);
  const auto g2 = job.wait_generation(2);
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->reason, "join");
  EXPECT_EQ(g2->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g2->survivors, (std::vector<int>{0, 3}));
}

TEST(ElasticCoordinator, SilentRankLeavesWithItsReplica) {
  Job job(4, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  const auto stopped = std::chrono::steady_clock::now();
  job.stop_beating(2);
  const auto g = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g) << "no failure generation within 1 s of the last heartbeat\n" << job.log();
  const double after = Ms(std::chrono::steady_clock::now() - stopped).count();
  EXPECT_GE(after, 100) << "declared dead before its failure timeout";
  EXPECT_EQ(g->reason, "failure");
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g->replicas, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g->survivors, (std::vector<int>{0, 1, 3}));
  const auto excluded = job.excluded(1);  // publish's last act: the rest of its record is written by now
  EXPECT_EQ(*job.table().get(latest_generation_key()), "2");
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0].first, (Job::Processes{{2, Job::pid_of(2, 0)}}));
  EXPECT_NE(excluded[0].second.find("generation 2"), std::string::npos) << excluded[0].second;
  EXPECT_NE(job.log().find("rank 2 silent for"), std::string::npos) << job.log();
  EXPECT_FALSE(job.wait_generation(3, milliseconds(300))) << job.log();
}

namespace {
void accuse(Job& job, int64_t generation, int accuser, int accused, int restart = 0, const std::string& why = "tampered") {
  Accusation a;
  a.accused = accused;
  a.incarnation = Job::incarnation(accused, restart);
  a.why = why;
  job.store().set(accusation_key(generation, accuser), Job::bytes(encode_accusation(a)));
  job.store().add(accusations_key(), 1);
}
}  // namespace

// A member whose messages did not authenticate at another member (comm.encrypt) is excluded at once, though its
// heartbeat goes on: its launcher ends it. The accuser stays; an accusation back from the accused, or about a
// process that is not the member, or a malformed record, excludes nobody.
TEST(ElasticCoordinator, AnAccusedMemberIsExcludedAndItsAccuserStays) {
  Job job(4, 1, 5000);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.store().set(accusation_key(1, 0), Job::bytes("garbage"));
  job.store().add(accusations_key(), 1);
  accuse(job, 1, 1, 3, /*restart=*/4);  // not the process that is the member
  EXPECT_FALSE(job.wait_generation(2, milliseconds(300))) << "an accusation of another process excluded the member\n"
                                                          << job.log();
  const auto accused_at = std::chrono::steady_clock::now();
  accuse(job, 1, 2, 1, 0, "message 5 on tag 1056768 from rank 1 did not authenticate");
  std::this_thread::sleep_for(milliseconds(100));  // a few ticks: rank 2's accusation is read first
  accuse(job, 1, 1, 2);  // the accused accuses back
  const auto g = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g) << "the accused member was kept\n" << job.log();
  EXPECT_LT(Ms(std::chrono::steady_clock::now() - accused_at).count(), 1000) << "waited for a heartbeat timeout";
  EXPECT_EQ(g->reason, "failure");
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 2, 3})) << job.log();
  const auto excluded = job.excluded(1);
  ASSERT_EQ(excluded.size(), 1u);
  EXPECT_EQ(excluded[0].first, (Job::Processes{{1, Job::pid_of(1, 0)}})) << "its launcher ends the accused process";
  EXPECT_NE(job.log().find("rank 2 reports that rank 1's messages did not authenticate"), std::string::npos) << job.log();
  EXPECT_NE(job.log().find("rank 1 excluded: its messages to rank 2 did not authenticate"), std::string::npos) << job.log();
  // Restarted, it comes back: the accusation was against the process, not the rank.
  job.stop_beating(1);
  job.coordinator().rank_exited(1);
  job.start_rank(1, 1);
  const auto back = job.wait_generation(3, milliseconds(1500));
  ASSERT_TRUE(back) << job.log();
  EXPECT_EQ(back->reason, "join");
  EXPECT_EQ(back->ranks, (std::vector<int>{0, 1, 2, 3}));
}

TEST(ElasticCoordinator, ExitedRankDetectedBeforeItsHeartbeatTimeout) {
  Job job(4, 1, 5000);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.coordinator().rank_exited(7);  // not a rank of this job: ignored
  job.coordinator().rank_exited(1);
  const auto exited = std::chrono::steady_clock::now();
  job.stop_beating(1);
  const auto g = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g) << "an exited rank waited for its 5 s heartbeat timeout\n" << job.log();
  EXPECT_LT(Ms(std::chrono::steady_clock::now() - exited).count(), 1000);
  EXPECT_EQ(g->reason, "failure");
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 2, 3}));
  EXPECT_TRUE(job.excluded(1, milliseconds(200)).empty()) << "the launcher reported its exit: nothing to end";
}

TEST(ElasticCoordinator, ExitedRankRestartsAndJoins) {
  Job job(2, 1, 5000);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.stop_beating(1);
  job.coordinator().rank_exited(1);
  const auto g2 = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->reason, "failure");
  EXPECT_EQ(g2->ranks, (std::vector<int>{0}));
  job.start_rank(1, 1);  // the launcher restarted it
  const auto g3 = job.wait_generation(3, milliseconds(1000));
  ASSERT_TRUE(g3) << job.log();
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->incarnations.at(1), Job::incarnation(1, 1));
  EXPECT_FALSE(job.wait_generation(4, milliseconds(300))) << "the old process's exit stuck to the new one\n"
                                                          << job.log();
}

TEST(ElasticCoordinator, StepVotesDecideAtTheFirstIncompleteStep) {
  Job job(4, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  auto& store = job.store();
  // The members started generation 1 at step 5, committed step 5, and 3 of 4 voted for step 6.
  ASSERT_EQ(store.compareSet(start_key(1), {}, Job::bytes("5")), Job::bytes("5"));
  for (int i = 0; i < 4; ++i) store.add(vote_key(1, 5), 1);
  store.set(decision_key(1, 5), Job::bytes(encode_decision({true, 0})));  // the last voter's commit
  for (int i = 0; i < 3; ++i) store.add(vote_key(1, 6), 1);
  job.stop_beating(3);
  const auto g = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g) << job.log();
  const auto decision = job.wait_key(decision_key(1, 6), milliseconds(1000));
  ASSERT_TRUE(decision) << "no decision for the interrupted step 6\n" << job.log();
  EXPECT_EQ(*decision, "abort 2");
  const Decision d = decode_decision(*decision);
  EXPECT_FALSE(d.commit);
  EXPECT_EQ(d.next_generation, 2);
  EXPECT_EQ(*job.table().get(decision_key(1, 5)), "commit 0") << "the committed step must keep its decision";
  EXPECT_FALSE(job.table().get(decision_key(1, 7))) << "only the first incomplete step is decided";
  EXPECT_EQ(*job.table().get(start_key(1)), "5");
  // A late 4th vote for step 6 cannot complete the count: it must wait for (and get) the abort.
  EXPECT_NE(store.add(vote_key(1, 6), 1), 4);
  EXPECT_GE(store.add(vote_key(1, 6), 0), kPoison);
  // Generation 2 stays open.
  EXPECT_FALSE(job.table().get(start_key(2)));
}

// The last voter of step 5 was killed between its vote and writing the decision (the chaos benchmark caught it:
// a survivor that had voted waited for that decision until the store's 30 s timeout, then failed). Closing the
// generation, the coordinator writes the committed step's decision, with the successor, and aborts step 6.
TEST(ElasticCoordinator, AStepEveryoneVotedGetsItsDecisionWhenItsLastVoterDiedBeforeWritingIt) {
  Job job(2, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  auto& store = job.store();
  ASSERT_EQ(store.compareSet(start_key(1), {}, Job::bytes("5")), Job::bytes("5"));
  for (int i = 0; i < 2; ++i) store.add(vote_key(1, 5), 1);  // both voted; no decision written
  job.stop_beating(1);
  ASSERT_TRUE(job.wait_generation(2, milliseconds(1000))) << job.log();
  const auto committed = job.wait_key(decision_key(1, 5), milliseconds(1000));
  ASSERT_TRUE(committed) << "nobody decided the step every member voted for\n" << job.log();
  EXPECT_EQ(*committed, "commit 2");
  const auto aborted = job.wait_key(decision_key(1, 6), milliseconds(1000));
  ASSERT_TRUE(aborted) << job.log();
  EXPECT_EQ(*aborted, "abort 2");
}

TEST(ElasticCoordinator, StepVotesAbortTheStartStepWhenNobodyVoted) {
  Job job(2, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  ASSERT_EQ(job.store().compareSet(start_key(1), {}, Job::bytes("12")), Job::bytes("12"));
  job.store().add(vote_key(1, 12), 1);  // 1 of 2
  job.stop_beating(0);
  ASSERT_TRUE(job.wait_generation(2, milliseconds(1000))) << job.log();
  const auto decision = job.wait_key(decision_key(1, 12), milliseconds(1000));
  ASSERT_TRUE(decision) << job.log();
  EXPECT_EQ(*decision, "abort 2");
}

TEST(ElasticCoordinator, UnstartedGenerationIsClosed) {
  Job job(4, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.stop_beating(0);
  ASSERT_TRUE(job.wait_generation(2, milliseconds(1000))) << job.log();
  const auto closed = job.wait_key(start_key(1), milliseconds(1000));
  ASSERT_TRUE(closed) << job.log();
  EXPECT_EQ(*closed, kClosed);
  // A member that comes late to start generation 1 learns it was closed.
  EXPECT_EQ(job.store().compareSet(start_key(1), {}, Job::bytes("3")), Job::bytes(kClosed));
  EXPECT_FALSE(job.table().get(start_key(2))) << "the new generation is open";
  // Nobody starts generation 2 either; a second failure closes it.
  job.stop_beating(1);
  const auto g3 = job.wait_generation(3, milliseconds(1000));
  ASSERT_TRUE(g3) << job.log();
  EXPECT_EQ(g3->ranks, (std::vector<int>{2, 3}));
  const auto closed2 = job.wait_key(start_key(2), milliseconds(1000));
  ASSERT_TRUE(closed2) << job.log();
  EXPECT_EQ(*closed2, kClosed);
}

TEST(ElasticCoordinator, RestartedRankJoinsAgain) {
  Job job(4, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.stop_beating(2);
  const auto g2 = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g2) << job.log();
  ASSERT_EQ(g2->ranks, (std::vector<int>{0, 1, 3}));
  job.start_rank(2, 1);  // its new process
  const auto g3 = job.wait_generation(3, milliseconds(1000));
  ASSERT_TRUE(g3) << job.log();
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g3->survivors, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(g3->incarnations.at(2), Job::incarnation(2, 1));
  EXPECT_FALSE(job.wait_generation(4, milliseconds(300))) << job.log();
  EXPECT_EQ(job.coordinator().generation(), 3);  // (set just after the record: read once nothing moves)
  EXPECT_EQ(job.excluded().size(), 1u) << "a join excludes nobody";
}

TEST(ElasticCoordinator, JoinSupersedesAStartedGenerationThenAFailureClosesTheJoin) {
  Job job(2, 1, 150);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.stop_beating(1);
  ASSERT_TRUE(job.wait_generation(2, milliseconds(1000))) << job.log();
  auto& store = job.store();
  ASSERT_EQ(store.compareSet(start_key(2), {}, Job::bytes("4")), Job::bytes("4"));
  store.add(vote_key(2, 4), 1);  // the only member commits step 4
  job.start_rank(1, 1);
  ASSERT_TRUE(job.wait_generation(3, milliseconds(1000))) << job.log();
  // Members switch to generation 3 after step 4 and start it at step 5.
  ASSERT_EQ(store.compareSet(start_key(3), {}, Job::bytes("5")), Job::bytes("5"));
  store.add(vote_key(3, 5), 1);  // 1 of 2
  std::this_thread::sleep_for(milliseconds(50));  // the coordinator drops generation 2 (superseded, started)
  job.stop_beating(0);
  ASSERT_TRUE(job.wait_generation(4, milliseconds(1000))) << job.log();
  const auto decision = job.wait_key(decision_key(3, 5), milliseconds(1000));
  ASSERT_TRUE(decision) << job.log();
  EXPECT_EQ(*decision, "abort 4") << job.log();
  EXPECT_FALSE(job.table().get(decision_key(2, 5))) << "the superseded generation takes no more votes";
  EXPECT_LT(store.add(vote_key(2, 4), 0), kPoison) << "the superseded generation's votes are left alone";
}

// pp=2, dp=2: replica 0 = ranks {0, 2}, replica 1 = ranks {1, 3}.
TEST(ElasticCoordinator, FailedReplicaLeavesWholeAndRejoinsOnlyWithNewProcesses) {
  Job job(4, 2, 150);
  job.start_all();
  const auto g1 = job.wait_generation(1);
  ASSERT_TRUE(g1) << job.log();
  EXPECT_EQ(g1->replicas, (std::vector<int>{0, 1}));
  // Rank 0 restarts (a new process registers); rank 2, the rest of its replica, is still the old process.
  job.start_rank(0, 1);
  const auto g2 = job.wait_generation(2, milliseconds(1000));
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->reason, "failure");
  EXPECT_EQ(g2->ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(g2->survivors, (std::vector<int>{1}));
  ASSERT_EQ(job.excluded(1).size(), 1u);
  // Both old processes: rank 0's too (the launcher may not have reaped it), by its old pid.
  EXPECT_EQ(job.excluded()[0].first, (Job::Processes{{0, Job::pid_of(0, 0)}, {2, Job::pid_of(2, 0)}}));
  // The launcher is ending the old rank 2 (told so through exclude): its replica must not rejoin with it.
  EXPECT_FALSE(job.wait_generation(3, milliseconds(300)))
      << "a generation admitted a process the coordinator had excluded\n" << job.log();
  job.start_rank(2, 1);
  const auto g3 = job.wait_generation(3, milliseconds(1000));
  ASSERT_TRUE(g3) << job.log();
  EXPECT_EQ(g3->reason, "join");
  EXPECT_EQ(g3->ranks, (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(g3->incarnations.at(0), Job::incarnation(0, 1));
  EXPECT_EQ(g3->incarnations.at(2), Job::incarnation(2, 1));
}

TEST(ElasticCoordinator, MalformedRegistrationIsIgnored) {
  Job job(2, 1, 500);
  job.start_rank(0);
  job.store().set(registration_key(1), Job::bytes("{not json"));
  job.store().add(roster_key(), 1);
  EXPECT_FALSE(job.wait_generation(1, milliseconds(200)));
  job.start_rank(1);
  const auto g = job.wait_generation(1);
  ASSERT_TRUE(g) << job.log();
  EXPECT_EQ(g->ranks, (std::vector<int>{0, 1}));
}

namespace {

// The members of generation 1 start it at step 1 and all vote for it: step 1 commits (as the last voter writes).
void commit_first_step(Job& job, int members) {
  auto& store = job.store();
  ASSERT_EQ(store.compareSet(start_key(1), {}, Job::bytes("1")), Job::bytes("1"));
  for (int i = 0; i < members; ++i) store.add(vote_key(1, 1), 1);
  store.set(decision_key(1, 1), Job::bytes(encode_decision({true, 0})));
  std::this_thread::sleep_for(milliseconds(100));  // a tick sees generation 1 commit
}

}  // namespace

// With a standby elsewhere, node 0's coordinator publishes a failure only while it holds half of the generations
// that trained. Generation 1 (every rank) committed step 1; then ranks die:
// - two of three at once, silently: no failure generation (they may be training on at the standby);
// - once their launchers report the exits here and restart them, this side holds them again: it goes on.
TEST(ElasticCoordinator, WithAStandbyAFailureNeedsHalfOfTheGenerationsThatTrained) {
  Job job(3, 1, 400, milliseconds(3000), /*quorum=*/true);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  auto& store = job.store();
  commit_first_step(job, 3);
  job.stop_beating({1, 2});
  EXPECT_FALSE(job.wait_generation(2, milliseconds(1500))) << job.log();
  EXPECT_NE(job.log().find("no quorum: generation 2 would keep 1 rank of generation 1's 3,"), std::string::npos)
      << job.log();
  // New processes of ranks 1 and 2 register here before their old ones' exits are known: still no quorum (the
  // old processes may be the standby's).
  job.start_rank(1, 1);
  job.start_rank(2, 1);
  EXPECT_FALSE(job.wait_generation(2, milliseconds(1000))) << job.log();
  // The launchers report the old processes' exits (through the store, as other nodes' launchers do).
  for (int rank : {1, 2}) {
    store.set(exited_key(rank), Job::bytes(std::to_string(Job::pid_of(rank, 0))));
    store.add(exits_key(), 1);
  }
  const auto g2 = job.wait_generation(2, milliseconds(1500));
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->reason, "failure");
  EXPECT_EQ(g2->ranks, (std::vector<int>{0}));
}

// Ranks that the detector has not declared dead yet, but whose replicas are gone, do not count: only the failure
// generation's members (who must vote for any step) and processes restarted here do. pp=2, dp=3: replica 0 = ranks
// {0, 3}, replica 1 = {1, 4}, replica 2 = {2, 5}. Ranks 1 and 2 fall silent; 4 and 5 still beat (a lagging death,
// or a process that lost its partner), so generation 2 would be replica 0 alone: 2 ranks of generation 1's 6.
TEST(ElasticCoordinator, WithAStandbyRanksOfLostReplicasDoNotCountForTheQuorum) {
  Job job(6, 2, 400, milliseconds(3000), /*quorum=*/true);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  commit_first_step(job, 6);
  job.stop_beating({1, 2});
  EXPECT_FALSE(job.wait_generation(2, milliseconds(1500))) << job.log();
  EXPECT_NE(job.log().find("no quorum: generation 2 would keep 2 ranks of generation 1's 6,"), std::string::npos)
      << job.log();
}

// Without a standby the same loss is published at once: nobody else could take the job over.
TEST(ElasticCoordinator, WithoutAStandbyALossOfMostRanksIsPublished) {
  Job job(3, 1, 400);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  job.stop_beating({1, 2});
  const auto g2 = job.wait_generation(2, milliseconds(3000));
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->ranks, (std::vector<int>{0}));
}

// A refusal while a failure generation is still forming leaves it in place: the coordinator never falls back to a
// first generation (which needs no quorum) of the ranks left. Five ranks: rank 4 is lost (generation 2 of four is
// published: 4 of 5), then ranks 2 and 3 together; ranks 0 and 1 are 2 of 5: nothing more is published.
TEST(ElasticCoordinator, WithAStandbyARefusalWhileAFailureFormsPublishesNothingElse) {
  Job job(5, 1, 400, milliseconds(300), /*quorum=*/true);
  job.start_all();
  ASSERT_TRUE(job.wait_generation(1)) << job.log();
  commit_first_step(job, 5);
  job.stop_beating(4);
  const auto g2 = job.wait_generation(2, milliseconds(3000));
  ASSERT_TRUE(g2) << job.log();
  EXPECT_EQ(g2->ranks, (std::vector<int>{0, 1, 2, 3}));
  job.stop_beating({2, 3});
  EXPECT_FALSE(job.wait_generation(3, milliseconds(2000))) << job.log();
  for (int64_t id = 4; id <= 5; ++id)
    EXPECT_FALSE(job.table().get(generation_key(id))) << "published " << id << " without a quorum\n" << job.log();
  EXPECT_NE(job.log().find("no quorum: generation 3 would keep 2 ranks of generation 1's 5,"), std::string::npos)
      << job.log();
}

