// The Slurm executor against two real Slurm clusters started by the test on this machine
// (scripts/slurm_testbed.sh: munge, slurmctld and slurmd each): a gang with a share on each runs and ends Done,
// a gang that one cluster refuses leaves nothing running on the other, stop cancels every share, a stopped
// controller is reported lost, and a new executor finds its jobs from the work folder. Needs root.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "crosstrain/scheduler/command.h"
#include "crosstrain/scheduler/slurm_executor.h"
#include "scratch.h"

using namespace crosstrain::scheduler;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

const std::string kTestbed = CT_SOURCE_DIR "/scripts/slurm_testbed.sh";

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class TwoSlurmClusters : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run slurmd";
    root_ = crosstrain::testing::scratch_path("slurm");
    for (const char* name : {"east", "west"}) restart(name);
  }
  static void TearDownTestSuite() {
    for (const char* name : {"east", "west"}) run_command({kTestbed, "stop", (root_ / name).string()}, {}, milliseconds(30000));
    fs::remove_all(root_);
  }
  static SlurmCluster cluster(const std::string& name) { return {name, (root_ / name / "slurm.conf").string(), ""}; }

  SlurmExecutor executor(ShareCommand command) {
    return SlurmExecutor({cluster("east"), cluster("west")}, (root_ / "work").string(), std::move(command),
                         milliseconds(15000));
  }
  static JobRecord job(int64_t id) {
    JobRecord j;
    j.id = id;
    j.spec.name = "test" + std::to_string(id);
    return j;
  }
  static PlacementRecord gang(int east_ranks, int west_ranks) {
    PlacementRecord p;
    p.shares = {{"east", east_ranks, "dp=" + std::to_string(east_ranks)}, {"west", west_ranks, "dp=" + std::to_string(west_ranks)}};
    p.sync = crosstrain::planner::LayoutSync::DiLoCo;
    return p;
  }
  // Polls until the job is no longer running (or 30 s pass).
  static ExecStatus wait_end(SlurmExecutor& e, int64_t id) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    ExecStatus s = e.status(id);
    while (s.kind == ExecStatus::Running && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(200));
      s = e.status(id);
    }
    return s;
  }
  static std::string squeue(const std::string& name, const std::string& id) {
    return run_command({"squeue", "-h", "-j", id, "-o", "%T"}, {{"SLURM_CONF", cluster(name).conf}}, milliseconds(10000))
        .output;
  }
  // Slurm's state of a job once it has settled: "" when it is gone (a cancelled job passes COMPLETING first).
  static std::string settled(const std::string& name, const std::string& id) {
    std::string state = squeue(name, id);
    for (int i = 0; i < 100 && (state == "COMPLETING\n" || state == "CANCELLED\n"); ++i) {
      std::this_thread::sleep_for(milliseconds(100));
      state = squeue(name, id);
    }
    return state;
  }

  static void stop_controller(const std::string& name) {
    const std::string pid = slurp(root_ / name / "slurmctld.pid");
    ASSERT_EQ(::kill(std::stoi(pid), SIGTERM), 0);
    for (int i = 0; i < 50 && ::kill(std::stoi(pid), 0) == 0; ++i) std::this_thread::sleep_for(milliseconds(100));
  }
  // The whole cluster again, for the tests after this one.
  static void restart(const std::string& name) {
    const auto r = run_command({kTestbed, "start", (root_ / name).string(), name, std::to_string(port(name))}, {},
                               milliseconds(60000));
    ASSERT_TRUE(r.ok()) << r.output;
  }
  static int port(const std::string& name) { return 21000 + (::getpid() % 400) * 20 + (name == "west" ? 10 : 0); }

  static fs::path root_;
};

fs::path TwoSlurmClusters::root_;

}  // namespace

TEST_F(TwoSlurmClusters, AGangWithAShareOnEachClusterRunsAndEndsDone) {
  const fs::path out = root_ / "gang-out";
  fs::create_directories(out);
  auto e = executor([&](const JobRecord&, const PlacementRecord&, size_t) {
    return "echo cluster=$CROSSTRAIN_CLUSTER_NAME offset=$CROSSTRAIN_RANK_OFFSET world=$CROSSTRAIN_WORLD_SIZE "
           "tasks=$SLURM_NTASKS > " + out.string() + "/share$CROSSTRAIN_SHARE.txt";
  });
  e.start(job(1), gang(1, 2));
  EXPECT_EQ(e.slurm_ids(1).size(), 2u);
  const ExecStatus s = wait_end(e, 1);
  ASSERT_EQ(s.kind, ExecStatus::Done) << s.detail;
  EXPECT_EQ(slurp(out / "share0.txt"), "cluster=east offset=0 world=3 tasks=1\n");
  EXPECT_EQ(slurp(out / "share1.txt"), "cluster=west offset=1 world=3 tasks=2\n");
}

TEST_F(TwoSlurmClusters, AGangOneClusterRefusesLeavesNothingRunningOnTheOther) {
  auto e = executor([](const JobRecord&, const PlacementRecord&, size_t) { return "sleep 60"; });
  // west's controller goes away between the placement and the start: its sbatch fails.
  stop_controller("west");
  try {
    e.start(job(2), gang(1, 1));
    ADD_FAILURE() << "a gang with an unreachable cluster started";
  } catch (const crosstrain::Error& err) {
    EXPECT_NE(std::string(err.what()).find("sbatch on cluster 'west' failed"), std::string::npos) << err.what();
  }
  const auto ids = e.slurm_ids(2);
  ASSERT_EQ(ids.count("east"), 1u) << "east's share was submitted before west refused";
  EXPECT_EQ(settled("east", ids.at("east")), "") << "and then cancelled: no partial gang";
  restart("west");
}

TEST_F(TwoSlurmClusters, StopCancelsEveryShareAndANewExecutorFindsTheJob) {
  auto e = executor([](const JobRecord&, const PlacementRecord&, size_t) { return "sleep 60"; });
  e.start(job(3), gang(1, 1));
  auto again = executor([](const JobRecord&, const PlacementRecord&, size_t) { return ""; });
  EXPECT_EQ(again.slurm_ids(3), e.slurm_ids(3)) << "the job's folder records its Slurm jobs";
  EXPECT_EQ(again.status(3).kind, ExecStatus::Running) << again.status(3).detail;
  again.stop(3);
  const ExecStatus s = wait_end(e, 3);
  EXPECT_EQ(s.kind, ExecStatus::Failed);
  EXPECT_NE(s.detail.find("without an exit status"), std::string::npos) << s.detail;
  for (const auto& [name, id] : e.slurm_ids(3)) EXPECT_EQ(settled(name, id), "") << name;
}

// stop() cancels and returns: the daemon's lock is not held while shares end. A share that ignores SIGTERM is
// watched by the executor's reaper, which sends SIGKILL after half the grace; then no cluster lists it.
TEST_F(TwoSlurmClusters, StopReturnsAtOnceAndTheReaperKillsAShareThatIgnoresTerm) {
  auto e = executor([](const JobRecord&, const PlacementRecord&, size_t) {
    return "trap '' TERM; while true; do sleep 0.2; done";
  });
  e.set_stop_grace(milliseconds(4000));
  e.start(job(5), gang(1, 1));
  const auto running_until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (e.status(5).detail.find("east: RUNNING west: RUNNING") == std::string::npos &&
         std::chrono::steady_clock::now() < running_until)
    std::this_thread::sleep_for(milliseconds(200));
  ASSERT_NE(e.status(5).detail.find("east: RUNNING west: RUNNING"), std::string::npos) << e.status(5).detail;
  const auto t0 = std::chrono::steady_clock::now();
  e.stop(5);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 3.0);
  EXPECT_GT(e.stopping(), 0u) << "the shares ignore SIGTERM: still listed, watched";
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (e.stopping() > 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(e.stopping(), 0u);
  for (const auto& [name, id] : e.slurm_ids(5)) EXPECT_EQ(settled(name, id), "") << name << " still lists it";
}

TEST_F(TwoSlurmClusters, AStoppedControllerIsReportedLost) {
  auto e = executor([](const JobRecord&, const PlacementRecord&, size_t) { return "true"; });
  EXPECT_TRUE(e.lost_clusters().empty());
  stop_controller("west");
  EXPECT_EQ(e.lost_clusters(), std::vector<std::string>{"west"});
  restart("west");
  EXPECT_TRUE(e.lost_clusters().empty());
}
