// The gang scheduler over the simulated executor: re-placement after a cluster is lost, recovery from the SQLite
// file, gangs never partial under random load, and a small run of the benchmark.
#include <gtest/gtest.h>

#include <cstdio>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/bench.h"
#include "crosstrain/scheduler/observed_executor.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/sim_executor.h"
#include "scheduler_test_util.h"

namespace crosstrain::scheduler {
namespace {

std::string temp_path(const std::string& name) {
  const std::string p = (std::filesystem::temp_directory_path() /
                         ("ct_gang_" + std::to_string(::getpid()) + "_" + name)).string();
  for (const char* s : {"", "-wal", "-shm"}) std::remove((p + s).c_str());
  return p;
}

JobSpec job(const std::string& model, int ranks, int64_t steps) {
  JobSpec j;
  j.name = model + "x" + std::to_string(ranks);
  j.model = planner::model_preset(model);
  j.ranks = ranks;
  j.global_batch = 768;  // divisible by every dp of 8..96 ranks
  j.steps = steps;
  j.checkpoint_every = 10;
  return j;
}

struct Rig {
  explicit Rig(const std::string& path, Registry r = testing::two_clusters(1))
      : exec(SimulatedExecutor::for_registry(r)), store(path),
        sched(std::move(r), store, exec, {}, [this] { return exec.now(); }) {}
  SimulatedExecutor exec;
  StateStore store;
  Scheduler sched;
};

// Three clusters of 64 A100 ("a", "b", "c"), shares that shrink and grow live.
std::unique_ptr<Rig> three_cluster_rig(const std::string& path) {
  Registry r = testing::two_clusters(1);
  r.add_cluster(testing::cluster("c", "a100", 8), testing::a100());
  auto rig = std::make_unique<Rig>(path, std::move(r));
  rig->exec.allow_share_changes(true);
  return rig;
}

// Submits a job of `ranks` (192: one share on each of the three clusters) and lets a pass place it.
int64_t place(Rig& rig, int ranks) {
  const int64_t id = rig.sched.submit(job("gpt2-xl", ranks, 100000));
  rig.sched.tick();
  return id;
}

TEST(GangScheduler, ALostClustersJobsResumeFromTheirCheckpointElsewhere) {
  Rig rig(temp_path("loss.db"));
  const int64_t id = rig.sched.submit(job("gpt2", 32, 100000));
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).state, JobState::Running);
  const std::string first = rig.sched.job(id).placement->shares.at(0).cluster;
  const std::string other = first == "a" ? "b" : "a";
  // Run 25 steps (checkpoints every 10: the newest is step 20), then lose the cluster.
  rig.exec.advance(rig.sched.job(id).placement->step_s * 25.5);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).step, 20);
  rig.exec.lose(first);
  rig.sched.tick();  // sees the loss, displaces the job, places it on the survivor
  const JobRecord& j = rig.sched.job(id);
  ASSERT_EQ(j.state, JobState::Running) << j.reason;
  EXPECT_EQ(j.attempts, 2);
  EXPECT_EQ(j.step, 20);
  ASSERT_EQ(j.placement->shares.size(), 1u);
  EXPECT_EQ(j.placement->shares[0].cluster, other);
  EXPECT_EQ(rig.exec.used(first), 0);
  EXPECT_EQ(rig.exec.used(other), 32);
  EXPECT_EQ(rig.exec.status(id).step, 20);  // the executor resumed it from the checkpoint
  EXPECT_FALSE(rig.sched.registry().up(rig.sched.registry().index_of(first)));
  bool displaced = false;
  for (const EventRow& e : rig.store.events(id)) displaced = displaced || e.kind == "displaced";
  EXPECT_TRUE(displaced);
}

TEST(GangScheduler, ASpanningJobIsStoppedEverywhereWhenOneOfItsClustersIsLost) {
  Registry r = testing::two_clusters(1);
  r.add_cluster(testing::cluster("c", "a100", 8), testing::a100());
  Rig rig(temp_path("span.db"), std::move(r));
  const int64_t id = rig.sched.submit(job("gpt2-xl", 96, 100000));
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).placement->shares.size(), 2u);
  const std::string lost = rig.sched.job(id).placement->shares[0].cluster;
  rig.exec.lose(lost);
  rig.sched.tick();
  const JobRecord& j = rig.sched.job(id);
  ASSERT_TRUE(holds_devices(j.state)) << j.reason;
  EXPECT_FALSE(j.placement->on(lost));
  EXPECT_EQ(j.placement->ranks(), 96);
  int used = 0;
  for (const char* c : {"a", "b", "c"}) used += rig.exec.used(c);
  EXPECT_EQ(used, 96);  // the old gang is gone from every cluster, the new one is whole
}

bool has_event(StateStore& store, int64_t id, const std::string& kind) {
  for (const EventRow& e : store.events(id))
    if (e.kind == kind) return true;
  return false;
}

// A DiLoCo job across two clusters (elastic training across clusters) goes on without a lost cluster's share,
// holding none of its devices and without a restart, and grows back onto it when it returns; a share that fails
// alone is started again while restarts are left. Losing share 0 (the job's rendezvous) still re-places it.
TEST(GangScheduler, AnElasticJobShrinksWhenAClusterIsLostAndGrowsBackWhenItReturns) {
  auto owned = three_cluster_rig(temp_path("live.db"));
  Rig& rig = *owned;
  JobSpec spec = job("gpt2-xl", 96, 100000);
  spec.max_restarts = 1;
  const int64_t id = rig.sched.submit(spec);
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).state, JobState::Running) << rig.sched.job(id).reason;
  const PlacementRecord first = *rig.sched.job(id).placement;
  ASSERT_EQ(first.shares.size(), 2u);
  ASSERT_TRUE(first.live_elastic()) << "placed " << first.layout << " " << planner::to_string(first.sync);
  const std::string keep = first.shares[0].cluster, lost = first.shares[1].cluster;
  const int lost_ranks = first.shares[1].ranks;

  rig.exec.advance(first.step_s * 25.5);
  rig.exec.lose(lost);
  rig.sched.tick();
  const JobRecord& j = rig.sched.job(id);
  ASSERT_EQ(j.state, JobState::Running) << j.reason;
  EXPECT_EQ(j.attempts, 1) << "re-placed instead of going on";
  EXPECT_EQ(rig.exec.starts(), 1);
  EXPECT_TRUE(j.placement->shares[1].absent);
  EXPECT_FALSE(j.placement->on(lost));
  EXPECT_EQ(j.placement->present_ranks(), 96 - lost_ranks);
  EXPECT_EQ(rig.exec.used(lost), 0);
  const int c = rig.sched.registry().index_of(lost);
  EXPECT_EQ(rig.sched.registry().free(c), rig.sched.registry().devices(c)) << "the lost share's devices are held";
  EXPECT_TRUE(has_event(rig.store, id, "shrunk"));
  EXPECT_FALSE(has_event(rig.store, id, "displaced"));
  EXPECT_EQ(rig.exec.status(id).step, 25) << "the job went on at its pace";

  // The cluster comes back (it registers again): the share starts into the running job.
  rig.exec.restore(lost);
  rig.sched.mark_up(lost);
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).state, JobState::Running);
  EXPECT_FALSE(rig.sched.job(id).placement->shares[1].absent);
  EXPECT_EQ(rig.exec.used(lost), lost_ranks);
  EXPECT_EQ(rig.exec.share_starts(), 1);
  EXPECT_TRUE(has_event(rig.store, id, "grew"));

  // A share that fails alone is started again while restarts are left; the state file keeps an absent share.
  rig.exec.crash(id, 1);
  rig.sched.tick();  // shrinks (restart 1 of 1) ...
  EXPECT_EQ(rig.sched.job(id).restarts, 1);
  rig.sched.tick();  // ... and grows back
  EXPECT_FALSE(rig.sched.job(id).placement->shares[1].absent);
  EXPECT_EQ(rig.exec.share_starts(), 2);
  rig.exec.crash(id, 1);
  rig.sched.tick();  // no restarts left: it goes on without it for good
  rig.sched.tick();
  EXPECT_TRUE(rig.sched.job(id).placement->shares[1].absent);
  EXPECT_EQ(rig.exec.share_starts(), 2);
  for (const JobRecord& stored : rig.store.jobs())
    if (stored.id == id) EXPECT_TRUE(stored.placement->shares[1].absent) << "the state file lost the absent share";

  // Losing share 0's cluster (the job's rendezvous and membership) of two shares still stops and re-places the
  // gang: the survivor alone is no majority, so no standby can take the store over.
  rig.exec.lose(keep);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).attempts, 2);
  EXPECT_TRUE(has_event(rig.store, id, "displaced"));
  EXPECT_EQ(rig.exec.overcommits(), 0);
  EXPECT_EQ(rig.exec.partial_gangs(), 0);
}

// Three clusters: the launchers have a standby store on share 1's node, so losing share 0's cluster (the job's
// store and membership) no longer re-places the job: it goes on with the others (a majority of the ranks), the
// state file records that the store moved, and share 0 comes back into the running job. Once the store is on share
// 1, losing share 1 re-places the job (nobody holds a standby any more). A share 0 that fails to start again in the
// background stays absent and is tried later: the running job is not queued again.
TEST(GangScheduler, AThreeClusterJobGoesOnWithoutShareZeroWhoseStoreTheStandbyTookOver) {
  Registry r = testing::two_clusters(1);
  r.add_cluster(testing::cluster("c", "a100", 8), testing::a100());
  const std::string path = temp_path("standby.db");
  SimulatedExecutor sim = SimulatedExecutor::for_registry(r);
  sim.allow_share_changes(true);
  ObservedExecutor exec(sim);  // starts and stops on its thread, failures reported by the next status, as the daemon's
  StateStore store(path);
  Scheduler sched(std::move(r), store, exec, {}, [&] { return sim.now(); });
  const auto settled_tick = [&] {
    sched.tick();
    ASSERT_TRUE(exec.settle(std::chrono::milliseconds(5000)));
    exec.observe(std::vector<int64_t>{1});
  };
  JobSpec spec = job("gpt2-xl", 192, 100000);
  spec.max_restarts = 1;
  const int64_t id = sched.submit(spec);
  settled_tick();
  ASSERT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  const PlacementRecord first = *sched.job(id).placement;
  ASSERT_EQ(first.shares.size(), 3u) << first.layout;
  ASSERT_TRUE(first.live_elastic());
  EXPECT_TRUE(first.standby);
  EXPECT_TRUE(store.job(id)->placement->standby) << "the state file forgot the standby";

  sim.advance(first.step_s * 25.5);
  sim.lose(first.shares[0].cluster);
  settled_tick();
  settled_tick();
  const JobRecord& j = sched.job(id);
  ASSERT_EQ(j.state, JobState::Running) << j.reason;
  EXPECT_EQ(j.attempts, 1) << "re-placed instead of going on";
  EXPECT_EQ(sim.starts(), 1);
  EXPECT_TRUE(j.placement->shares[0].absent);
  EXPECT_TRUE(j.placement->rendezvous_moved);
  EXPECT_TRUE(store.job(id)->placement->rendezvous_moved) << "the state file forgot where the store went";
  EXPECT_FALSE(has_event(store, id, "displaced"));
  bool said = false;
  for (const EventRow& e : store.events(id))
    said = said || (e.kind == "shrunk" && e.detail.find("the standby on " + first.shares[1].cluster + " holds its store") !=
                                              std::string::npos);
  EXPECT_TRUE(said) << "the shrink does not say where the store went";

  // Share 0's cluster returns, but its share fails to start (on the executor's thread): it stays absent.
  sim.restore(first.shares[0].cluster);
  exec.observe(std::vector<int64_t>{id});  // the daemon's pass asks the clusters before it acts
  sched.mark_up(first.shares[0].cluster);
  sim.fail_next_share_start(id);
  settled_tick();
  settled_tick();
  EXPECT_EQ(sched.job(id).state, JobState::Running);
  EXPECT_EQ(sched.job(id).attempts, 1) << "a failed start of share 0 queued the running job again";
  EXPECT_TRUE(sched.job(id).placement->shares[0].absent);
  EXPECT_TRUE(has_event(store, id, "grow-failed"));
  EXPECT_FALSE(has_event(store, id, "start-failed"));
  // Tried again 10 s later: it joins the running job.
  sim.advance(11);
  settled_tick();
  settled_tick();
  EXPECT_FALSE(sched.job(id).placement->shares[0].absent);
  EXPECT_EQ(sim.share_starts(), 1);
  EXPECT_TRUE(has_event(store, id, "grew"));
  // Back in, share 0 is a member like the others: when it fails the job goes on without it again.
  sim.crash(id, 0);
  settled_tick();
  settled_tick();
  EXPECT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  EXPECT_EQ(sched.job(id).attempts, 1) << "share 0 back in and failed: the job was re-placed";
  EXPECT_EQ(sched.job(id).restarts, 1);

  // The store lives on share 1 now: losing its cluster stops the job, to be placed again from its checkpoint (the
  // two clusters left are too small for it: it waits).
  sim.lose(first.shares[1].cluster);
  settled_tick();
  settled_tick();
  EXPECT_EQ(sched.job(id).state, JobState::Queued);
  EXPECT_TRUE(has_event(store, id, "displaced"));
  EXPECT_EQ(sim.overcommits(), 0);
  EXPECT_EQ(sim.partial_gangs(), 0);
}

// With sites, share 0 does not come back once the standby holds the store (its rank 0 would write the job's outputs
// at its own site again, which lacks the rows trained meanwhile): the job goes on without it, a daemon restart too.
TEST(GangScheduler, WithSitesShareZeroStaysOutOnceTheStandbyHoldsTheStore) {
  auto owned = three_cluster_rig(temp_path("sites.db"));
  Rig& rig = *owned;
  rig.exec.use_sites(true);
  const int64_t id = place(rig, 192);
  const std::string east = rig.sched.job(id).placement->shares.at(0).cluster;
  rig.exec.lose(east);
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).state, JobState::Running) << rig.sched.job(id).reason;
  EXPECT_TRUE(rig.sched.job(id).placement->share0_stays_out);
  rig.exec.restore(east);
  rig.sched.mark_up(east);
  rig.sched.tick();
  Scheduler restarted(rig.sched.registry(), rig.store, rig.exec, {}, [&] { return rig.exec.now(); });
  restarted.tick();
  EXPECT_TRUE(restarted.job(id).placement->shares[0].absent);
  EXPECT_EQ(rig.exec.share_starts(), 0);
  bool said = false;
  for (const EventRow& e : rig.store.events(id)) said = said || e.detail.find(east + " does not come back") != std::string::npos;
  EXPECT_TRUE(said);
}

// A share whose cluster stays down grows onto another cluster of the same device that the job does not use (one
// that registered meanwhile, or a free one), once --move-after-s has passed: the job is whole again without its
// lost cluster. Sooner, it waits for its own.
TEST(GangScheduler, AShareWhoseClusterStaysDownGrowsOntoAnotherCluster) {
  auto owned = three_cluster_rig(temp_path("move.db"));
  Rig& rig = *owned;
  const int64_t id = place(rig, 96);
  const PlacementRecord first = *rig.sched.job(id).placement;
  ASSERT_EQ(first.shares.size(), 2u);
  std::string unused;
  for (const char* c : {"a", "b", "c"})
    if (!first.on(c)) unused = c;
  const std::string lost = first.shares[1].cluster;
  rig.exec.lose(lost);
  rig.sched.tick();
  rig.exec.advance(20);
  rig.sched.tick();
  EXPECT_TRUE(rig.sched.job(id).placement->shares[1].absent) << "moved before --move-after-s (30 s)";
  // The first try there fails to start: the share stays absent, still of its own cluster, and the event names the
  // cluster tried.
  rig.exec.fail_next_share_start(id);
  rig.exec.advance(11);
  rig.sched.tick();
  EXPECT_TRUE(rig.sched.job(id).placement->shares[1].absent);
  EXPECT_EQ(rig.sched.job(id).placement->shares[1].cluster, lost);
  bool named = false;
  for (const EventRow& e : rig.store.events(id)) named = named || (e.kind == "grow-failed" && e.detail.rfind(unused + ":", 0) == 0);
  EXPECT_TRUE(named);
  EXPECT_EQ(rig.exec.used(unused), 0) << "the failed try holds its devices";
  rig.exec.advance(11);
  rig.sched.tick();
  const JobRecord& j = rig.sched.job(id);
  ASSERT_FALSE(j.placement->shares[1].absent) << "the share did not grow elsewhere";
  EXPECT_EQ(j.placement->shares[1].cluster, unused);
  EXPECT_EQ(j.attempts, 1);
  EXPECT_EQ(rig.exec.used(unused), first.shares[1].ranks);
  EXPECT_EQ(rig.store.job(id)->placement->shares[1].cluster, unused) << "the state file forgot where the share went";
  bool said = false;
  for (const EventRow& e : rig.store.events(id)) said = said || e.detail.find("in place of " + lost + " (down)") != std::string::npos;
  EXPECT_TRUE(said);
  // Its own cluster comes back: nothing moves again.
  rig.exec.restore(lost);
  rig.sched.mark_up(lost);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).placement->shares[1].cluster, unused);
  EXPECT_EQ(rig.exec.share_starts(), 1);
  EXPECT_EQ(rig.exec.overcommits(), 0);
}

// A cluster reached at no address of its own (no --cluster-host on Slurm) can host no standby store: its launchers
// would listen at the one address every cluster shares.
TEST(GangScheduler, NoStandbyWhereShareOnesClusterHasNoAddressOfItsOwn) {
  auto owned = three_cluster_rig(temp_path("noaddress.db"));
  Rig& rig = *owned;
  rig.exec.share_one_address(true);
  const int64_t id = place(rig, 192);
  ASSERT_EQ(rig.sched.job(id).placement->shares.size(), 3u);
  EXPECT_FALSE(rig.sched.job(id).placement->standby);
}

// A placement made before standbys existed (its state file row says none) loses share 0 into a re-placement, as it
// always did: its launchers were started without --standby, so nobody could take the store over.
TEST(GangScheduler, APlacementWithoutAStandbyIsRePlacedWhenShareZeroIsLost) {
  auto owned = three_cluster_rig(temp_path("nostandby.db"));
  Rig& rig = *owned;
  const int64_t id = place(rig, 192);
  ASSERT_EQ(rig.sched.job(id).placement->shares.size(), 3u);
  EXPECT_TRUE(rig.sched.job(id).placement->standby);
  JobRecord old = rig.sched.job(id);
  old.placement->standby = false;  // as a schema 3 file reads back
  rig.store.update_job(old);
  Scheduler restarted(rig.sched.registry(), rig.store, rig.exec, {}, [&] { return rig.exec.now(); });
  rig.exec.lose(old.placement->shares[0].cluster);
  restarted.tick();
  EXPECT_EQ(restarted.job(id).state, JobState::Queued) << "it went on without share 0";
  EXPECT_TRUE(has_event(rig.store, id, "displaced"));
}

// Priorities: a later job of higher priority is placed first; one that only lower-priority jobs keep out preempts
// them (each stops, keeping its newest checkpoint, and waits again), and they resume once it is done.
TEST(GangScheduler, HigherPriorityGoesFirstAndPreemptsLowerPriorityJobsWhichResumeFromTheirCheckpoint) {
  Rig rig(temp_path("priority.db"));
  JobSpec low = job("gpt2", 64, 100000);
  low.name = "low";
  JobSpec high = job("gpt2", 128, 200);
  high.name = "high";
  high.priority = 10;
  const int64_t a = rig.sched.submit(low), b = rig.sched.submit(low);  // both clusters' 128 devices
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(a).state, JobState::Running);
  ASSERT_EQ(rig.sched.job(b).state, JobState::Running);
  rig.exec.advance(rig.sched.job(a).placement->step_s * 25.5);  // checkpoints every 10: step 20 is the newest
  rig.sched.tick();
  const int64_t h = rig.sched.submit(high);
  rig.sched.tick();  // the head (priority 10) fits only if both low jobs go
  ASSERT_EQ(rig.sched.job(h).state, JobState::Running) << rig.sched.job(h).reason;
  for (int64_t id : {a, b}) {
    const JobRecord& j = rig.sched.job(id);
    EXPECT_EQ(j.state, JobState::Queued) << id;
    EXPECT_GE(j.step, 10) << "preempted without keeping its checkpoint";
    EXPECT_NE(j.reason.find("preempted by job " + std::to_string(h)), std::string::npos) << j.reason;
    EXPECT_TRUE(has_event(rig.store, id, "preempted"));
  }
  EXPECT_EQ(rig.exec.overcommits(), 0);
  // A job of the same priority as a running one never preempts it.
  JobSpec peer = high;
  peer.name = "peer";
  const int64_t p = rig.sched.submit(peer);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(p).state, JobState::Queued);
  EXPECT_EQ(rig.sched.job(h).state, JobState::Running);
  // The high job ends; the peer (priority 10) goes before the preempted low jobs, which then resume.
  rig.exec.advance(rig.sched.job(h).placement->step_s * 201);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(h).state, JobState::Done);
  EXPECT_EQ(rig.sched.job(p).state, JobState::Running);
  rig.exec.advance(rig.sched.job(p).placement->step_s * 201);
  rig.sched.tick();
  for (int64_t id : {a, b}) {
    ASSERT_EQ(rig.sched.job(id).state, JobState::Running) << rig.sched.job(id).reason;
    EXPECT_EQ(rig.exec.status(id).step, rig.sched.job(id).step) << "did not resume from its checkpoint";
  }
}

// Quotas: a user's jobs hold at most their quota of devices at once; the rest waits saying so, while another
// user's job runs on the free devices.
TEST(GangScheduler, AUsersQuotaHoldsItsJobsBackButNotOtherUsers) {
  const std::string path = temp_path("quota.db");
  SimulatedExecutor exec = SimulatedExecutor::for_registry(testing::two_clusters(1));
  StateStore store(path);
  SchedulerOptions options;
  options.quotas = {{"ann", 64}};
  Scheduler sched(testing::two_clusters(1), store, exec, options, [&] { return exec.now(); });
  JobSpec j = job("gpt2", 32, 100000);
  j.user = "ann";
  const int64_t a1 = sched.submit(j), a2 = sched.submit(j), a3 = sched.submit(j);
  j.user = "bob";
  const int64_t b1 = sched.submit(j);
  sched.tick();
  EXPECT_EQ(sched.job(a1).state, JobState::Running);
  EXPECT_EQ(sched.job(a2).state, JobState::Running);
  EXPECT_EQ(sched.job(a3).state, JobState::Queued);
  EXPECT_NE(sched.job(a3).reason.find("user ann's quota: holds 64 of 64"), std::string::npos) << sched.job(a3).reason;
  EXPECT_EQ(sched.job(b1).state, JobState::Running) << "another user's job waited behind ann's quota";
  // One of ann's jobs ends: the waiting one starts.
  sched.cancel(a1);
  sched.tick();
  EXPECT_EQ(sched.job(a3).state, JobState::Running) << sched.job(a3).reason;
}

// Accounting: device-seconds by user and cluster, while jobs run (so far) and after they end (kept in the file).
TEST(GangScheduler, UsageIsAccountedByUserAndCluster) {
  Rig rig(temp_path("usage.db"));
  JobSpec j = job("gpt2", 32, 100);
  j.user = "ann";
  const int64_t id = rig.sched.submit(j);
  rig.sched.tick();
  ASSERT_EQ(rig.sched.job(id).state, JobState::Running);
  const std::string cluster = rig.sched.job(id).placement->shares[0].cluster;
  const double step_s = rig.sched.job(id).placement->step_s;
  rig.exec.advance(50 * step_s);
  auto now = rig.sched.usage();
  ASSERT_EQ(now.size(), 1u);
  EXPECT_EQ(now[0].user, "ann");
  EXPECT_EQ(now[0].cluster, cluster);
  EXPECT_NEAR(now[0].device_s, 32 * 50 * step_s, 1e-6 * now[0].device_s) << "a running job's use so far";
  rig.exec.advance(60 * step_s);
  rig.sched.tick();  // done after 100 steps
  ASSERT_EQ(rig.sched.job(id).state, JobState::Done);
  const auto kept = rig.store.usage();
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_NEAR(kept[0].device_s, 32 * 110 * step_s, 1e-6 * kept[0].device_s) << "from its start to its end";
  EXPECT_NEAR(rig.sched.usage()[0].device_s, kept[0].device_s, 1e-9) << "an ended job no longer adds";
}

TEST(GangScheduler, RestartRecoversEveryJobAndPlacementFromTheFile) {
  const std::string path = temp_path("restart.db");
  std::vector<JobRecord> before;
  std::vector<int> free_before;
  std::vector<bool> up_before;
  SimulatedExecutor exec = SimulatedExecutor::for_registry(testing::two_clusters(1));
  {
    StateStore store(path);
    Scheduler s(testing::two_clusters(1), store, exec, {}, [&exec] { return exec.now(); });
    for (int i = 0; i < 12; ++i) s.submit(job(i % 2 ? "gpt2" : "gpt2-medium", 8 << (i % 4), 200 + 500 * (i % 3)));
    s.submit(job("gpt2", 1000, 10));  // rejected
    s.tick();
    exec.advance(30);
    s.tick();
    s.cancel(s.jobs().back()->id - 1);
    exec.lose("b");
    s.tick();
    for (const JobRecord* j : s.jobs()) before.push_back(*j);
    for (int i = 0; i < s.registry().size(); ++i) {
      free_before.push_back(s.registry().free(i));
      up_before.push_back(s.registry().up(i));
    }
  }
  StateStore store(path);
  Scheduler s(Registry{}, store, exec, {}, [&exec] { return exec.now(); });
  ASSERT_EQ(s.jobs().size(), before.size());
  std::map<JobState, int> states;
  for (size_t k = 0; k < before.size(); ++k) {
    const JobRecord& a = before[k];
    const JobRecord& b = *s.jobs()[k];
    ++states[a.state];
    EXPECT_EQ(b.id, a.id);
    EXPECT_EQ(job_spec_to_json(b.spec), job_spec_to_json(a.spec));
    EXPECT_EQ(b.state, a.state) << a.id;
    EXPECT_EQ(b.attempts, a.attempts);
    EXPECT_EQ(b.step, a.step);
    EXPECT_EQ(b.reason, a.reason);
    EXPECT_EQ(b.submitted_s, a.submitted_s);
    ASSERT_EQ(b.placement.has_value(), a.placement.has_value()) << a.id;
    if (!a.placement) continue;
    EXPECT_EQ(b.placement->layout, a.placement->layout);
    EXPECT_EQ(b.placement->sync, a.placement->sync);
    EXPECT_EQ(b.placement->step_s, a.placement->step_s);
    ASSERT_EQ(b.placement->shares.size(), a.placement->shares.size());
    for (size_t i = 0; i < a.placement->shares.size(); ++i) {
      EXPECT_EQ(b.placement->shares[i].cluster, a.placement->shares[i].cluster);
      EXPECT_EQ(b.placement->shares[i].ranks, a.placement->shares[i].ranks);
    }
  }
  // The run covered the interesting states, so the comparison means something.
  EXPECT_GT(states[JobState::Running], 0);
  EXPECT_GT(states[JobState::Queued], 0);
  EXPECT_GT(states[JobState::Failed], 0);
  EXPECT_GT(states[JobState::Cancelled], 0);
  for (int i = 0; i < s.registry().size(); ++i) {
    EXPECT_EQ(s.registry().free(i), free_before[i]) << s.registry().info(i).name;
    EXPECT_EQ(s.registry().up(i), up_before[i]);
  }
  EXPECT_EQ(s.queued(), static_cast<size_t>(states[JobState::Queued]));
}

TEST(GangScheduler, AJobPlacedButNotStartedBeforeARestartIsStartedAfterIt) {
  const std::string path = temp_path("placed.db");
  SimulatedExecutor exec = SimulatedExecutor::for_registry(testing::two_clusters(1));
  int64_t id = 0;
  {
    StateStore store(path);
    Scheduler s(testing::two_clusters(1), store, exec, {}, [&exec] { return exec.now(); });
    // As if the scheduler died between committing the placement and starting the gang.
    JobRecord j = s.job(s.submit(job("gpt2", 16, 1000)));
    id = j.id;
    j.state = JobState::Placed;
    j.attempts = 1;
    j.placement = PlacementRecord{{{"b", 16, "dp=16 tp=1 pp=1"}}, "dp=16", planner::LayoutSync::Sync, 1, 0.5, 0, 1, 1};
    store.update_job(j);
  }
  StateStore store(path);
  Scheduler s(Registry{}, store, exec, {}, [&exec] { return exec.now(); });
  EXPECT_EQ(s.registry().free(s.registry().index_of("b")), 48);  // reserved again from the file
  EXPECT_EQ(s.queued(), 0u);
  s.tick();
  EXPECT_EQ(s.job(id).state, JobState::Running);
  EXPECT_EQ(exec.used("b"), 16);
  EXPECT_EQ(exec.used("a"), 0);
}

// Invariants after every operation: each job holding devices has a whole gang reserved and running; each
// cluster's free devices are its devices less exactly those reservations; the executor never saw a partial gang.
void check_invariants(const Scheduler& s, const SimulatedExecutor& exec) {
  const Registry& r = s.registry();
  std::map<std::string, int> held;
  for (const JobRecord* j : s.jobs()) {
    if (!holds_devices(j->state)) {
      EXPECT_FALSE(j->placement) << "job " << j->id << " is " << to_string(j->state) << " with a placement";
      continue;
    }
    ASSERT_TRUE(j->placement) << j->id;
    EXPECT_EQ(j->placement->ranks(), j->spec.ranks) << "partial gang: job " << j->id;
    for (const auto& sh : j->placement->shares) held[sh.cluster] += sh.ranks;
    EXPECT_EQ(j->state == JobState::Running, exec.running(j->id)) << j->id;
  }
  for (int i = 0; i < r.size(); ++i) {
    const std::string name = r.info(i).name;
    EXPECT_EQ(r.free(i), r.devices(i) - held[name]) << name;
    EXPECT_GE(r.free(i), 0) << name;
    EXPECT_EQ(exec.used(name), held[name]) << name;
  }
  EXPECT_EQ(exec.partial_gangs(), 0);
  EXPECT_EQ(exec.overcommits(), 0);
}

TEST(GangScheduler, GangsAreNeverPartialUnderRandomLoad) {
  for (uint64_t seed : {1u, 2u, 3u}) {
    std::mt19937_64 rng(seed);
    Registry r = bench_registry(4, rng);
    std::vector<std::string> names;
    for (const ClusterInfo& c : r.clusters()) names.push_back(c.name);
    SimulatedExecutor exec = SimulatedExecutor::for_registry(r);
    StateStore store(temp_path("random" + std::to_string(seed) + ".db"), {false});
    Scheduler s(std::move(r), store, exec, {}, [&exec] { return exec.now(); });
    for (int op = 0; op < 250; ++op) {
      const int what = static_cast<int>(rng() % 20);
      if (what < 10) {
        s.submit(bench_job(op, rng));
      } else if (what < 16) {
        exec.advance(static_cast<double>(rng() % 300));
      } else if (what == 16) {
        const std::string c = names[rng() % names.size()];
        exec.lose(c);
      } else if (what == 17) {
        const std::string c = names[rng() % names.size()];
        exec.restore(c);
        s.mark_up(c);
      } else if (what == 18 && !s.jobs().empty()) {
        s.cancel(s.jobs()[rng() % s.jobs().size()]->id);
      } else if (!s.jobs().empty()) {
        exec.fail_next_start(s.jobs().back()->id);
      }
      s.tick();
      check_invariants(s, exec);
      if (::testing::Test::HasFailure()) FAIL() << "seed " << seed << " op " << op;
    }
    EXPECT_GT(exec.starts(), 20) << "seed " << seed;
  }
}

TEST(GangScheduler, AFailedStartHoldsNothingAndIsRetried) {
  Rig rig(temp_path("failstart.db"));
  const int64_t id = rig.sched.submit(job("gpt2", 16, 1000));
  rig.exec.fail_next_start(id);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).state, JobState::Queued);
  EXPECT_NE(rig.sched.job(id).reason.find("start failed"), std::string::npos);
  EXPECT_EQ(rig.sched.registry().free_total(), 128);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).state, JobState::Running);
  EXPECT_EQ(rig.sched.registry().free_total(), 112);
}

TEST(GangScheduler, JobsRunToCompletionAndGiveTheirDevicesBack) {
  Rig rig(temp_path("complete.db"));
  const int64_t big = rig.sched.submit(job("gpt2", 64, 100));
  const int64_t also = rig.sched.submit(job("gpt2", 64, 100));
  const int64_t waits = rig.sched.submit(job("gpt2", 64, 100));
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(big).state, JobState::Running);
  EXPECT_EQ(rig.sched.job(also).state, JobState::Running);
  EXPECT_EQ(rig.sched.job(waits).state, JobState::Queued);
  rig.exec.advance(1e6);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(big).state, JobState::Done);
  EXPECT_EQ(rig.sched.job(big).step, 100);
  EXPECT_EQ(rig.sched.job(waits).state, JobState::Running);
  EXPECT_THROW(rig.sched.job(999), UsageError);
}

TEST(GangScheduler, TheSimulatedExecutorCountsAPartialGangOrAnOvercommit) {
  SimulatedExecutor exec = SimulatedExecutor::for_registry(testing::two_clusters(1));
  JobRecord j;
  j.id = 7;
  j.spec = job("gpt2", 16, 100);
  EXPECT_THROW(exec.start(j, PlacementRecord{{{"a", 8, ""}}, "", planner::LayoutSync::Sync, 1, 1, 0, 0, 1}), Error);
  EXPECT_EQ(exec.partial_gangs(), 1);
  EXPECT_EQ(exec.used("a"), 0);
  j.spec.ranks = 72;
  EXPECT_THROW(exec.start(j, PlacementRecord{{{"a", 72, ""}}, "", planner::LayoutSync::Sync, 1, 1, 0, 0, 1}), Error);
  EXPECT_EQ(exec.overcommits(), 1);
  EXPECT_EQ(exec.used("a"), 0);
}

TEST(GangScheduler, AQueuedJobPastItsDeadlineFails) {
  Rig rig(temp_path("deadline.db"));
  const int64_t hog = rig.sched.submit(job("gpt2", 128, 1000000));
  JobSpec hurry = job("gpt2", 16, 10);
  hurry.qos.deadline_s = 100;
  const int64_t id = rig.sched.submit(hurry);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(hog).state, JobState::Running);
  EXPECT_EQ(rig.sched.job(id).state, JobState::Queued);
  rig.exec.advance(101);
  rig.sched.tick();
  EXPECT_EQ(rig.sched.job(id).state, JobState::Failed);
  EXPECT_NE(rig.sched.job(id).reason.find("deadline"), std::string::npos);
  EXPECT_EQ(rig.sched.queued(), 0u);
}

// The resource layer's registration: a cluster that joins makes room for a waiting job; a lost one that returns
// comes back up; a measured link is kept; all of it survives a restart.
TEST(GangScheduler, ClustersRegisterAndComeBackAndTheFileKeepsThem) {
  const std::string path = temp_path("register.db");
  Registry one;
  one.add_cluster(testing::cluster("a", "a100", 8), testing::a100());
  {
    Rig rig(path, one);
    ASSERT_EQ(rig.sched.submit(job("gpt2", 64, 100000)), 1);
    const int64_t second = rig.sched.submit(job("gpt2", 64, 100000));
    rig.sched.tick();
    ASSERT_EQ(rig.sched.job(second).state, JobState::Queued) << "a's 64 devices are busy";
    planner::ClusterFile b;
    b.clusters.push_back(testing::cluster("b", "a100", 8));
    b.devices.emplace("a100", testing::a100());
    EXPECT_EQ(rig.sched.register_cluster(b), "added");
    EXPECT_EQ(rig.sched.register_cluster(b), "unchanged");
    rig.sched.set_link("a", "b", testing::gbps_link(100, 0.01));
    rig.sched.tick();
    ASSERT_EQ(rig.sched.job(second).state, JobState::Running) << rig.sched.job(second).reason;
    EXPECT_EQ(rig.sched.job(second).placement->shares.at(0).cluster, "b");
    rig.sched.mark_lost("b");
    EXPECT_EQ(rig.sched.registry().free_total(), 0);
    EXPECT_EQ(rig.sched.register_cluster(b), "up") << "a lost cluster that registers again is back";
    EXPECT_EQ(rig.sched.registry().free_total(), 64);
    planner::ClusterFile changed = b;
    changed.clusters[0].hosts = 2;
    EXPECT_THROW(rig.sched.register_cluster(changed), UsageError);
  }
  Rig again(path, one);
  EXPECT_EQ(again.sched.registry().size(), 2) << "the registered cluster is in the file";
  EXPECT_NEAR(again.sched.registry().link("a", "b").bandwidth_Bps, 100e9 / 8, 1);
}

// A gang that fails is placed again from its newest checkpoint, up to max_restarts times (counted across a
// restart of the scheduler), then the job fails with the reason.
TEST(GangScheduler, AFailedGangRestartsFromItsCheckpointUpToMaxRestarts) {
  const std::string path = temp_path("restarts.db");
  int64_t id = 0;
  {
    Rig rig(path);
    JobSpec spec = job("gpt2", 32, 100000);
    spec.max_restarts = 2;
    id = rig.sched.submit(spec);
    rig.sched.tick();
    rig.exec.advance(rig.sched.job(id).placement->step_s * 25.5);
    rig.exec.crash(id);
    rig.sched.tick();  // sees the failure, queues it again from step 20 and places it in the same pass
    const JobRecord& j = rig.sched.job(id);
    ASSERT_EQ(j.state, JobState::Running) << j.reason;
    EXPECT_EQ(j.step, 20);
    EXPECT_EQ(j.attempts, 2);
    EXPECT_EQ(j.restarts, 1);
    EXPECT_EQ(rig.exec.status(id).step, 20) << "the new gang starts from the checkpoint";
  }
  Rig rig(path);  // the count survives a restart of the scheduler
  EXPECT_EQ(rig.sched.job(id).restarts, 1);
  rig.exec.start(rig.sched.job(id), *rig.sched.job(id).placement);
  for (int crash = 0; crash < 2; ++crash) {
    rig.exec.crash(id);
    rig.sched.tick();
  }
  EXPECT_EQ(rig.sched.job(id).state, JobState::Failed);
  EXPECT_EQ(rig.sched.job(id).restarts, 2);
  EXPECT_NE(rig.sched.job(id).reason.find("simulated crash"), std::string::npos) << rig.sched.job(id).reason;
}

TEST(GangScheduler, BenchSmoke) {
  SchedulerBenchOptions o;
  o.jobs = 60;
  o.clusters = 4;
  o.state_path = temp_path("bench.db");
  const SchedulerBenchResult r = run_scheduler_bench(o);
  EXPECT_EQ(r.partial_gangs, 0);
  EXPECT_EQ(r.overcommits, 0);
  EXPECT_GT(r.placements, 20);
  EXPECT_GT(r.done, 20);
  EXPECT_GT(r.decision_p95_ms, 0);
  EXPECT_FALSE(r.lost_cluster.empty());
  EXPECT_GT(r.displaced, 0);
  // The counts read back from the placed events (their text grew a note on each cluster once, and counted nothing).
  EXPECT_GT(r.spanning, 0);
  EXPECT_GT(r.diloco, 0);
  EXPECT_LE(r.diloco, r.spanning);
  const std::string line = r.line();
  for (const char* key : {"placements_per_s=", "decision_p95_ms=", "partial_gangs=0", "replace_after_loss_s="})
    EXPECT_NE(line.find(key), std::string::npos) << line;
}

}  // namespace
}  // namespace crosstrain::scheduler
