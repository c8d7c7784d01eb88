// Live shrink and grow of a real job (issue 35): the scheduler with the local executor runs a DiLoCo recipe job
// across two clusters of this machine. West's share is killed (its cluster's power cut) and the cluster marked
// lost: the job goes on with east without any of east's processes restarting and without repeating a step; west
// comes back and the job grows onto it at a join generation; it ends done with every step once. Prints shrink_s
// and grow_back_s, the times from the loss (and the return) to the job training on the new set.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cli_fixture.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/scheduler/local_executor.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/state_store.h"
#include "crosstrain/scheduler/train_share.h"
#include "scratch.h"

namespace crosstrain::scheduler {
namespace {
namespace fs = std::filesystem;
using crosstrain::testing::kBin;
using crosstrain::testing::kRecipes;
using Clock = std::chrono::steady_clock;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Two clusters of `east` and one CPU, joined by a slow link: a job of east + 1 ranks spans both, and DiLoCo is the
// layout.
Registry two_cpus(const fs::path& dir, int east = 1, std::vector<std::string> names = {"east", "west"}) {
  const fs::path file = dir / "clusters.toml";
  std::ofstream out(file);
  out << "name = \"two-local-clusters\"\n[devices.cpu]\npeak_tflops = { fp32 = 0.05, bf16 = 0.05 }\nmemory_gb = 8\n"
         "memory_bandwidth_gbs = 20\npower_w = 15\ngemm_efficiency = 0.5\nprice_per_hour = 0.1\n";
  for (const std::string& name : names)
    out << "[[clusters]]\nname = \"" << name << "\"\ndevice = \"cpu\"\nhosts = 1\ndevices_per_host = "
        << (name == "east" ? east : 1) << "\n"
        << "[clusters.links.host]\nlatency_us = 5\nbandwidth_gbps = 40\n"
        << "[clusters.links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n";
  out << "[links.wan]\nlatency_us = 20000\nbandwidth_gbps = 0.05\n";
  out.close();
  return Registry::from_cluster_file(planner::load_cluster(file.string()));
}

JobSpec tiny_job(int64_t steps) {
  JobSpec j;
  j.name = "live";
  j.model.name = "gpt-tiny-2l";
  j.model.layers = 2, j.model.hidden = 32, j.model.heads = 2, j.model.vocab = 256, j.model.seq = 32;
  j.ranks = 2;
  j.global_batch = 8;
  j.steps = steps;
  j.checkpoint_every = 100;
  j.recipe = kRecipes + "/gpt-tiny.toml";
  j.overrides = {"model.n_layer=2", "model.n_embd=32", "model.n_head=2", "model.block_size=32",
                 "train.warmup_steps=2", "train.eval_every=0", "train.sample_tokens=0", "comm.timeout_s=20",
                 "run.log_every=1000", "sync.slow_rank=0", "sync.slow_ms=30"};
  return j;
}

// Waits (ticking the scheduler) until `done` holds or `seconds` pass.
template <class F>
bool tick_until(Scheduler& s, double seconds, F done) {
  const auto start = Clock::now();
  while (seconds_since(start) < seconds) {
    s.tick();
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

struct LiveFigures {
  double shrink_s = 0, grow_back_s = 0;
  int64_t staged = 0, step_at_loss = 0, step_at_join = 0;
};

// The job across east (`east` CPUs) and west (one): west's power goes mid-run and comes back; the job trains on
// and grows back, and ends done with every step once, `f` filled in (the test fails on the way otherwise).
void lose_and_regain_west(const std::string& tag, int east, JobSpec job, const std::string& shares, LiveFigures& f) {
  const fs::path root = crosstrain::testing::scratch_dir(tag);
  const fs::path work = root / "work";
  StateStore store((root / "state.db").string());
  TrainLaunch launch;
  launch.crosstrain = kBin;
  launch.rendezvous_timeout_s = 60;
  launch.sites = true;  // each cluster has storage of its own: no run folder is shared
  LocalExecutor exec(work.string(), train_share_command(launch, work.string()), std::chrono::milliseconds(5000));
  Scheduler sched(two_cpus(root, east), store, exec, {}, [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  });
  const int64_t steps = job.steps;
  const int64_t id = sched.submit(job);
  sched.tick();
  EXPECT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  if (sched.job(id).state != JobState::Running) return;
  std::string placed;
  for (const ClusterShare& sh : sched.job(id).placement->shares)
    placed += (placed.empty() ? "" : " + ") + sh.cluster + ":" + std::to_string(sh.ranks);
  EXPECT_EQ(placed, shares);
  EXPECT_TRUE(sched.job(id).placement->live_elastic()) << sched.job(id).placement->layout;
  const fs::path job_dir = job_dir_in(work.string(), id), run = job_run_dir(work.string(), id);
  const auto logged = [&] { return crosstrain::testing::last_logged_step(run.string()); };
  ASSERT_TRUE(tick_until(sched, 120, [&] { return logged() >= 40; })) << slurp(job_dir / "share0.out");
  const std::string east_group = slurp(job_dir / "share0.pid");

  // West's power goes: its share's processes die at once, then the scheduler sees the cluster lost.
  const pid_t west = static_cast<pid_t>(std::stol(slurp(job_dir / "share1.pid")));
  ::kill(-west, SIGKILL);
  const auto lost_at = Clock::now();
  const int64_t step_at_loss = logged();
  sched.mark_lost("west");
  ASSERT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  EXPECT_EQ(sched.job(id).attempts, 1) << "re-placed instead of going on";
  ASSERT_TRUE(sched.job(id).placement->shares[1].absent);
  ASSERT_TRUE(tick_until(sched, 60, [&] { return logged() > step_at_loss + 1; }))
      << "the job did not go on without west\n" << slurp(job_dir / "share0.out");
  f.shrink_s = seconds_since(lost_at);

  // West returns (it registers again): its share starts into the running job and joins it.
  ASSERT_TRUE(tick_until(sched, 30, [&] { return logged() > step_at_loss + 30; }));
  sched.mark_up("west");
  const auto up_at = Clock::now();
  ASSERT_TRUE(tick_until(sched, 90, [&] { return slurp(job_dir / "share0.out").find("(join): 2 replicas") != std::string::npos; }))
      << "west never joined\n" << slurp(job_dir / "share0.out") << slurp(job_dir / "share1.out");
  const int64_t step_at_join = logged();
  ASSERT_TRUE(tick_until(sched, 60, [&] { return logged() > step_at_join; }));
  f.grow_back_s = seconds_since(up_at);
  EXPECT_FALSE(sched.job(id).placement->shares[1].absent);

  ASSERT_TRUE(tick_until(sched, 240, [&] { return finished(sched.job(id).state); }))
      << slurp(job_dir / "share0.out");
  const std::string east_out = slurp(job_dir / "share0.out");
  ASSERT_EQ(sched.job(id).state, JobState::Done) << sched.job(id).reason << "\n" << east_out;
  EXPECT_EQ(sched.job(id).attempts, 1);
  EXPECT_EQ(slurp(job_dir / "share0.pid"), east_group) << "east's share was started again";
  EXPECT_EQ(east_out.find("restarting it"), std::string::npos) << "an east rank was restarted\n" << east_out;
  // Every step once: nothing before the loss was repeated, nothing skipped.
  const auto rows = crosstrain::testing::read_metrics(run.string());
  ASSERT_EQ(static_cast<int64_t>(rows.size()), steps);
  for (int64_t i = 0; i < steps; ++i) ASSERT_EQ(rows[i]["step"].get<int64_t>(), i + 1);
  // The final checkpoint is whole at both sites (each cluster wrote its half there, the halves crossed over the
  // job's connections): either one could resume the job.
  int64_t staged = 0;
  for (const char* site : {"east", "west"}) {
    const fs::path dir = site_run_dir(work.string(), site, id);
    EXPECT_EQ(newest_checkpoint_step(dir.string()), steps) << site << " has no final checkpoint";
    char name[32];
    std::snprintf(name, sizeof name, "step_%08lld", static_cast<long long>(steps));
    for (const auto& e : fs::directory_iterator(dir / "checkpoints" / name))
      if (e.path().extension() == ".safetensors") staged += static_cast<int64_t>(fs::file_size(e.path()));
  }
  EXPECT_EQ(run, site_run_dir(work.string(), "east", id)) << "the job's outputs are read at share 0's site";
  EXPECT_FALSE(fs::exists(job_dir / "run")) << "a shared run folder was used";
  bool shrunk = false, grew = false;
  for (const EventRow& e : store.events(id)) shrunk |= e.kind == "shrunk", grew |= e.kind == "grew";
  EXPECT_TRUE(shrunk && grew);
  // Each piece file of a checkpoint crossed to the other site once: half of what both sites hold.
  f.staged = staged / 2;
  f.step_at_loss = step_at_loss;
  f.step_at_join = step_at_join;
  fs::remove_all(root);
}

TEST(LiveElastic, AJobGoesOnWithoutALostClusterAndGrowsBackOntoItWhenItReturns) {
  LiveFigures f;
  lose_and_regain_west("live-elastic", 1, tiny_job(400), "east:1 + west:1", f);
  std::printf("shrink_s=%.2f grow_back_s=%.2f staged_bytes_per_checkpoint=%lld (loss at step %lld, join at step %lld)\n",
              f.shrink_s, f.grow_back_s, static_cast<long long>(f.staged), static_cast<long long>(f.step_at_loss),
              static_cast<long long>(f.step_at_join));
}

// Uneven shares (east 2 ranks, west 1): the launchers get each node's size, DiLoCo's clusters are blocks of those
// sizes, and the 1-rank cluster leaves and rejoins the running job the same way.
TEST(LiveElastic, UnevenSharesGoOnWithoutALostClusterAndGrowBack) {
  JobSpec job = tiny_job(240);
  job.ranks = 3;
  job.global_batch = 6;
  LiveFigures f;
  lose_and_regain_west("live-elastic-uneven", 2, job, "east:2 + west:1", f);
  EXPECT_GT(f.step_at_join, f.step_at_loss);
}

// A scheduler over the local executor and three one-CPU clusters of this machine (east, west, north), each with
// storage of its own when `sites`.
struct ThreeLocalClusters {
  ThreeLocalClusters(const std::string& tag, bool sites, SchedulerOptions options = {})
      : root(crosstrain::testing::scratch_dir(tag)),
        work(root / "work"),
        store((root / "state.db").string()),
        exec(work.string(), train_share_command(launch(sites), work.string()), std::chrono::milliseconds(5000)),
        sched(two_cpus(root, 1, {"east", "west", "north"}), store, exec, options, [] {
          return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        }) {}
  static TrainLaunch launch(bool sites) {
    TrainLaunch l;
    l.crosstrain = kBin;
    l.rendezvous_timeout_s = 60;
    l.sites = sites;
    return l;
  }
  fs::path root, work;
  StateStore store;
  LocalExecutor exec;
  Scheduler sched;
};

// A new home for a lost share (issue 35, item 3: "or a new one joins"): a job on two of three one-CPU clusters,
// each with storage of its own; the second share's cluster is lost and stays down, and with --move-after-s 0 the
// share grows at once onto the third, unused cluster, whose ranks join the running job and heal from the live
// state; the first share is never restarted, every step once, one placement.
TEST(LiveElastic, AShareWhoseClusterStaysDownGrowsOntoAThirdCluster) {
  SchedulerOptions options;
  options.move_after_s = 0;
  ThreeLocalClusters net("live-elastic-move", /*sites=*/true, options);
  const fs::path &root = net.root, &work = net.work;
  Scheduler& sched = net.sched;
  const JobSpec job = tiny_job(300);
  const int64_t id = sched.submit(job);
  sched.tick();
  ASSERT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  const PlacementRecord first = *sched.job(id).placement;
  ASSERT_EQ(first.shares.size(), 2u);
  std::string unused;
  for (const char* c : {"east", "west", "north"})
    if (!first.on(c)) unused = c;
  const fs::path job_dir = job_dir_in(work.string(), id), run = job_run_dir(work.string(), id);
  const auto logged = [&] { return crosstrain::testing::last_logged_step(run.string()); };
  ASSERT_TRUE(tick_until(sched, 120, [&] { return logged() >= 30; })) << slurp(job_dir / "share0.out");
  const std::string first_group = slurp(job_dir / "share0.pid");

  ::kill(-static_cast<pid_t>(std::stol(slurp(job_dir / "share1.pid"))), SIGKILL);
  sched.mark_lost(first.shares[1].cluster);
  ASSERT_TRUE(tick_until(sched, 30, [&] {
    const ClusterShare& s = sched.job(id).placement->shares[1];
    return !s.absent && s.cluster == unused;
  })) << "the share did not grow onto " << unused;
  ASSERT_TRUE(tick_until(sched, 90, [&] {
    const std::string out = slurp(job_dir / "share0.out");
    return out.find("(failure)") != std::string::npos && out.find("(join): 2 replicas", out.find("(failure)")) != std::string::npos;
  })) << "the moved share never joined\n" << slurp(job_dir / "share0.out") << slurp(job_dir / "share1.out");
  ASSERT_TRUE(tick_until(sched, 240, [&] { return finished(sched.job(id).state); })) << slurp(job_dir / "share0.out");
  ASSERT_EQ(sched.job(id).state, JobState::Done) << sched.job(id).reason << "\n" << slurp(job_dir / "share0.out");
  EXPECT_EQ(sched.job(id).attempts, 1);
  EXPECT_EQ(slurp(job_dir / "share0.pid"), first_group) << "the first share was started again";
  EXPECT_TRUE(fs::exists(site_run_dir(work.string(), unused, id))) << "the new share trained elsewhere than its site";
  const auto rows = crosstrain::testing::read_metrics(run.string());
  ASSERT_EQ(static_cast<int64_t>(rows.size()), job.steps);
  for (int64_t i = 0; i < job.steps; ++i) ASSERT_EQ(rows[i]["step"].get<int64_t>(), i + 1);
  fs::remove_all(root);
}

// Share 0's cluster is lost (issue 35, item 3): its node held the job's store and coordinator. Across three
// clusters the launchers have a standby store on share 1's node; the scheduler lets the job go on (no re-placement),
// the standby takes the store over with west's and north's ranks (a majority), and when east comes back its share
// starts with --rejoin against the standby and joins the running job. Every step once, one placement.
TEST(LiveElastic, TheClusterHoldingTheJobsStoreIsLostAndTheJobGoesOnAndTakesItBack) {
  ThreeLocalClusters net("live-elastic-share0", /*sites=*/false);
  const fs::path &root = net.root, &work = net.work;
  StateStore& store = net.store;
  Scheduler& sched = net.sched;
  JobSpec job = tiny_job(300);
  job.ranks = 3;
  job.global_batch = 6;
  const int64_t id = sched.submit(job);
  sched.tick();
  ASSERT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  ASSERT_EQ(sched.job(id).placement->shares.size(), 3u);
  ASSERT_EQ(sched.job(id).placement->shares[0].cluster, "east");
  const fs::path job_dir = job_dir_in(work.string(), id), run = job_run_dir(work.string(), id);
  EXPECT_NE(slurp(job_dir / "share2.sh").find("'--standby'"), std::string::npos) << slurp(job_dir / "share2.sh");
  const auto logged = [&] { return crosstrain::testing::last_logged_step(run.string()); };
  ASSERT_TRUE(tick_until(sched, 120, [&] { return logged() >= 30; })) << slurp(job_dir / "share0.out");
  const std::string west_group = slurp(job_dir / "share1.pid");

  ::kill(-static_cast<pid_t>(std::stol(slurp(job_dir / "share0.pid"))), SIGKILL);
  const int64_t step_at_loss = logged();
  sched.mark_lost("east");
  ASSERT_EQ(sched.job(id).state, JobState::Running) << sched.job(id).reason;
  EXPECT_EQ(sched.job(id).attempts, 1) << "re-placed instead of going on";
  ASSERT_TRUE(sched.job(id).placement->shares[0].absent);
  EXPECT_TRUE(sched.job(id).placement->rendezvous_moved);
  EXPECT_TRUE(store.job(id)->placement->rendezvous_moved) << "the state file forgot where the store went";
  ASSERT_TRUE(tick_until(sched, 90, [&] { return logged() > step_at_loss + 5; }))
      << "the job did not go on without east\n" << slurp(job_dir / "share1.out") << slurp(job_dir / "share2.out");
  EXPECT_NE(slurp(job_dir / "share1.out").find("takes over"), std::string::npos) << slurp(job_dir / "share1.out");

  sched.mark_up("east");
  ASSERT_TRUE(tick_until(sched, 90, [&] { return slurp(job_dir / "share1.out").find("(join): 3 replicas") != std::string::npos; }))
      << "east never came back\n" << slurp(job_dir / "share0.out") << slurp(job_dir / "share1.out");
  EXPECT_NE(slurp(job_dir / "share0.sh").find("'--rejoin'"), std::string::npos) << slurp(job_dir / "share0.sh");
  ASSERT_TRUE(tick_until(sched, 240, [&] { return finished(sched.job(id).state); })) << slurp(job_dir / "share1.out");
  ASSERT_EQ(sched.job(id).state, JobState::Done) << sched.job(id).reason << "\n" << slurp(job_dir / "share1.out");
  EXPECT_EQ(sched.job(id).attempts, 1);
  EXPECT_EQ(slurp(job_dir / "share1.pid"), west_group) << "west's share was started again";
  const auto rows = crosstrain::testing::read_metrics(run.string());
  ASSERT_EQ(static_cast<int64_t>(rows.size()), job.steps);
  for (int64_t i = 0; i < job.steps; ++i) ASSERT_EQ(rows[i]["step"].get<int64_t>(), i + 1);
  fs::remove_all(root);
}

}  // namespace
}  // namespace crosstrain::scheduler
