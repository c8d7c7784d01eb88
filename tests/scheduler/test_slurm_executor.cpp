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
#include "crosstrain/scheduler/train_share.h"
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

// Without a disk shared with the scheduler: the secret comes in the share's environment, its output stays in its
// cluster's own folder, and how it ended comes from Slurm (nothing of the share writes the scheduler's folder).
TEST_F(TwoSlurmClusters, AGangWithAShareOnEachClusterRunsAndEndsDone) {
  const fs::path out = root_ / "gang-out", sites = root_ / "sites";
  for (const char* name : {"east", "west"}) fs::create_directories(sites / name);
  fs::create_directories(out);
  std::vector<SlurmCluster> clusters{cluster("east"), cluster("west")};
  for (auto& c : clusters) c.site_dir = (sites / c.name).string();
  SlurmExecutor e(clusters, (root_ / "work").string(), [&](const JobRecord&, const PlacementRecord&, size_t) {
    return "echo cluster=$CROSSTRAIN_CLUSTER_NAME offset=$CROSSTRAIN_RANK_OFFSET world=$CROSSTRAIN_WORLD_SIZE "
           "tasks=$SLURM_NTASKS > " + out.string() + "/share$CROSSTRAIN_SHARE.txt; echo \"$CROSSTRAIN_SECRET\"";
  }, milliseconds(15000));
  e.start(job(1), gang(1, 2));
  EXPECT_EQ(e.slurm_ids(1).size(), 2u);
  const ExecStatus s = wait_end(e, 1);
  ASSERT_EQ(s.kind, ExecStatus::Done) << s.detail;
  EXPECT_EQ(slurp(out / "share0.txt"), "cluster=east offset=0 world=3 tasks=1\n");
  EXPECT_EQ(slurp(out / "share1.txt"), "cluster=west offset=1 world=3 tasks=2\n");
  const std::string secret = job_secret((root_ / "work").string(), 1);
  EXPECT_EQ(slurp(sites / "west" / ("job1-share1-" + e.slurm_ids(1).at("west") + ".out")), secret + "\n");
  for (const auto& entry : fs::directory_iterator(root_ / "work" / "job1")) {
    EXPECT_NE(entry.path().extension(), ".out") << "a share's output went to the scheduler's folder";
    if (entry.path().extension() == ".sh") EXPECT_EQ(slurp(entry.path()).find(secret), std::string::npos);
  }
}

// A share that fails: Slurm's ExitCode names its status, which the executor keeps once seen.
TEST_F(TwoSlurmClusters, AFailedShareIsReportedWithTheExitStatusSlurmGives) {
  auto e = executor([](const JobRecord&, const PlacementRecord&, size_t share) {
    return share == 1 ? std::string("exit 3") : std::string("true");
  });
  e.start(job(6), gang(1, 1));
  const ExecStatus s = wait_end(e, 6);
  ASSERT_EQ(s.kind, ExecStatus::Failed) << s.detail;
  EXPECT_NE(s.detail.find("share on west (Slurm job " + e.slurm_ids(6).at("west") + ") exited with 3"),
            std::string::npos) << s.detail;
  EXPECT_EQ(s.failed_share, 1);
  EXPECT_EQ(slurp(root_ / "work" / "job6" / "share1.exit"), "exited with 3 (Slurm: FAILED)");
}

TEST(SlurmJobState, TheNodeAtAnAddressIsFoundByItsNodeAddr) {
  const std::string nodes = "NodeName=east-node0 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.1 NodeHostName=h0\n"
                            "NodeName=east-node1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.10 NodeHostName=h1\n";
  EXPECT_EQ(node_at_address(nodes, "10.77.0.1"), "east-node0");
  EXPECT_EQ(node_at_address(nodes, "10.77.0.10"), "east-node1") << "the whole address, not its start";
  EXPECT_EQ(node_at_address(nodes, "10.77.0.2"), "");
}

// CPU clusters count their devices as CPUs; GPU clusters ask each node for its GPUs as gres.
TEST(SlurmJobState, ASharesRequestCountsCpusOrGpusByTheClustersDevice) {
  SlurmCluster cpu{"east", "/c", "", 2};
  using Args = std::vector<std::string>;
  EXPECT_EQ(share_resources(cpu, 2), (Args{"--nodes=1", "--ntasks=2"}));
  EXPECT_EQ(share_resources(cpu, 3), (Args{"--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2"}));
  SlurmCluster gpu{"west", "/c", "", 4};
  gpu.gpus = true;
  EXPECT_EQ(share_resources(gpu, 3), (Args{"--nodes=1", "--ntasks=3", "--gres=gpu:3"}));
  EXPECT_EQ(share_resources(gpu, 8), (Args{"--nodes=2", "--ntasks-per-node=1", "--gres=gpu:4"}));
}

TEST(SlurmJobState, ScontrolsOneLineIsReadForTheStateAndTheExitCode) {
  const auto done = parse_scontrol_job("JobId=12 JobName=ct1-east UserId=root(0) JobState=COMPLETED Reason=None "
                                       "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 RunTime=00:00:01\n");
  ASSERT_TRUE(done);
  EXPECT_TRUE(done->ended());
  EXPECT_EQ(done->failure(), "");
  const auto failed = parse_scontrol_job("JobId=13 JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0");
  ASSERT_TRUE(failed);
  EXPECT_EQ(failed->failure(), "exited with 3 (Slurm: FAILED)");
  const auto cancelled = parse_scontrol_job("JobId=14 JobState=CANCELLED Reason=None ExitCode=0:15");
  ASSERT_TRUE(cancelled);
  EXPECT_EQ(cancelled->failure(), "was ended by signal 15 (Slurm: CANCELLED)");
  const auto running = parse_scontrol_job("JobId=15 Comment=JobState=COMPLETED JobState=RUNNING ExitCode=0:0");
  ASSERT_TRUE(running);
  EXPECT_EQ(running->state, "RUNNING") << "a field's name inside another's value";
  EXPECT_FALSE(running->ended());
  EXPECT_FALSE(parse_scontrol_job("slurm_load_jobs error: Invalid job id specified"));
  EXPECT_FALSE(parse_scontrol_job("JobState=RUNNING ExitCode=x:0"));
  const auto from_accounting = parse_sacct_job("CANCELLED by 0|0:15\n");
  ASSERT_TRUE(from_accounting);
  EXPECT_EQ(from_accounting->failure(), "was ended by signal 15 (Slurm: CANCELLED)");
  ASSERT_TRUE(parse_sacct_job("COMPLETED|0:0"));
  EXPECT_EQ(parse_sacct_job("COMPLETED|0:0")->failure(), "");
  EXPECT_FALSE(parse_sacct_job("sacct: error: Slurm accounting storage is disabled"));
  EXPECT_TRUE(SlurmJobState{}.ended()) << "a job Slurm forgot has ended";
  EXPECT_NE(SlurmJobState{}.failure().find("without an exit status"), std::string::npos);
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
  EXPECT_NE(s.detail.find("CANCELLED"), std::string::npos) << s.detail;
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
