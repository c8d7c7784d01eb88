// The local executor (processes on this machine): a gang's shares run as process groups with the CROSSTRAIN_*
// variables, a share's exit status decides Failed or Done, stop() ends every process of every share (also those
// a share's command started in the background), and a new executor on the same folder finds the job.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "crosstrain/scheduler/local_executor.h"
#include "crosstrain/scheduler/train_share.h"
#include "scratch.h"

namespace crosstrain::scheduler {
namespace {
namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class LocalExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    work_ = crosstrain::testing::scratch_path(std::string("local-") +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(work_); }
  static JobRecord job(int64_t id) {
    JobRecord j;
    j.id = id;
    return j;
  }
  static PlacementRecord gang() {
    PlacementRecord p;
    p.shares = {{"east", 1, ""}, {"west", 2, ""}};
    return p;
  }
  static ExecStatus wait_end(LocalExecutor& e, int64_t id) {
    ExecStatus s = e.status(id);
    for (int i = 0; i < 200 && s.kind == ExecStatus::Running; ++i) {
      std::this_thread::sleep_for(milliseconds(50));
      s = e.status(id);
    }
    return s;
  }
  fs::path work_;
};

TEST_F(LocalExecutorTest, AGangRunsEveryShareWithItsPlaceInTheJobAndEndsDone) {
  const fs::path out = work_ / "out";
  fs::create_directories(out);
  LocalExecutor e(work_.string(), [&](const JobRecord&, const PlacementRecord&, size_t) {
    return "echo $CROSSTRAIN_CLUSTER_NAME $CROSSTRAIN_RANK_OFFSET $CROSSTRAIN_WORLD_SIZE > " + out.string() +
           "/share$CROSSTRAIN_SHARE.txt; echo \"$CROSSTRAIN_SECRET\" > " + out.string() + "/secret$CROSSTRAIN_SHARE";
  });
  e.start(job(1), gang());
  const ExecStatus s = wait_end(e, 1);
  ASSERT_EQ(s.kind, ExecStatus::Done) << s.detail;
  EXPECT_EQ(slurp(out / "share0.txt"), "east 0 3\n");
  EXPECT_EQ(slurp(out / "share1.txt"), "west 1 3\n");
  // The job's secret reaches every share in its environment, not through a file the script reads.
  const std::string secret = job_secret(work_.string(), 1);
  EXPECT_EQ(slurp(out / "secret0"), secret + "\n");
  EXPECT_EQ(slurp(out / "secret1"), secret + "\n");
  EXPECT_EQ(slurp(work_ / "job1" / "share0.sh").find(secret), std::string::npos);
  EXPECT_EQ(e.run_dir(1), (work_ / "job1" / "run").string());
}

TEST_F(LocalExecutorTest, AFailingShareFailsTheJobNamingIt) {
  LocalExecutor e(work_.string(), [](const JobRecord&, const PlacementRecord&, size_t share) {
    return share == 1 ? std::string("exit 3") : std::string("true");
  });
  e.start(job(2), gang());
  const ExecStatus s = wait_end(e, 2);
  ASSERT_EQ(s.kind, ExecStatus::Failed);
  EXPECT_NE(s.detail.find("share1"), std::string::npos) << s.detail;
  EXPECT_NE(s.detail.find("exited with 3"), std::string::npos) << s.detail;
}

TEST_F(LocalExecutorTest, StopEndsEveryProcessAndANewExecutorFindsTheJob) {
  const fs::path pids = work_ / "pids";
  fs::create_directories(pids);
  // Each share leaves a grandchild in the background: stop must reach it through the process group.
  LocalExecutor e(work_.string(), [&](const JobRecord&, const PlacementRecord&, size_t) {
    return "sleep 60 & echo $! > " + pids.string() + "/$CROSSTRAIN_SHARE; wait";
  }, milliseconds(3000));
  e.start(job(3), gang());
  for (int i = 0; i < 100 && !(fs::exists(pids / "0") && fs::exists(pids / "1")); ++i)
    std::this_thread::sleep_for(milliseconds(50));
  LocalExecutor again(work_.string(), [](const JobRecord&, const PlacementRecord&, size_t) { return ""; });
  EXPECT_EQ(again.status(3).kind, ExecStatus::Running) << again.status(3).detail;
  again.stop(3);
  for (const char* share : {"0", "1"}) {
    const int pid = std::stoi(slurp(pids / share));
    bool gone = false;
    for (int i = 0; i < 100 && !gone; ++i) {
      gone = ::kill(pid, 0) != 0;
      if (!gone) std::this_thread::sleep_for(milliseconds(50));
    }
    EXPECT_TRUE(gone) << "share " << share << "'s background sleep survived stop()";
  }
  const ExecStatus s = wait_end(e, 3);
  EXPECT_EQ(s.kind, ExecStatus::Failed);
}

TEST_F(LocalExecutorTest, ACheckpointInTheRunFolderIsReported) {
  LocalExecutor e(work_.string(), [&](const JobRecord&, const PlacementRecord&, size_t) {
    const std::string ckpt = (work_ / "job4" / "run" / "checkpoints" / "step_00000030").string();
    return "mkdir -p " + ckpt + " && touch " + ckpt + "/manifest.json";
  });
  PlacementRecord one;
  one.shares = {{"east", 1, ""}};
  e.start(job(4), one);
  const ExecStatus s = wait_end(e, 4);
  ASSERT_EQ(s.kind, ExecStatus::Done) << s.detail;
  EXPECT_EQ(s.checkpoint_step, 30);
}

// Issue 34: a placement of more ranks than this machine runs is refused before anything starts.
TEST_F(LocalExecutorTest, APlacementBeyondTheMachineIsRefusedAndStartsNothing) {
  LocalExecutor e(work_.string(), [](const JobRecord&, const PlacementRecord&, size_t) { return "true"; },
                  milliseconds(1000), /*max_ranks=*/2);
  try {
    e.start(job(4), gang());  // 3 ranks
    ADD_FAILURE() << "3 ranks were started on a machine that runs 2";
  } catch (const crosstrain::UsageError& error) {
    EXPECT_NE(std::string(error.what()).find("--max-local-ranks"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(fs::exists(work_ / "job4" / "share0.sh"));
  LocalExecutor roomy(work_.string(), [](const JobRecord&, const PlacementRecord&, size_t) { return "true"; },
                      milliseconds(1000), /*max_ranks=*/3);
  roomy.start(job(5), gang());
  EXPECT_EQ(wait_end(roomy, 5).kind, ExecStatus::Done);
}

}  // namespace
}  // namespace crosstrain::scheduler
