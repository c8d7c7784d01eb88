// The planner's chosen stage split goes to the trainer: plan a recipe on two devices of different speed, then
// train with the overrides it prints (a real 2-process run of a few steps).
#include <sys/wait.h>

#include <cstdio>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "subprocess.h"

namespace {

// The command's output (stdout and stderr) and its wait status; killed at the support library's deadline.
std::string run(const std::string& command, int* status) {
  const crosstrain::testing::ProcessResult r = crosstrain::testing::run_shell(command);
  *status = r.status;
  return r.output;
}

TEST(PlanToTrain, TheTrainerRunsTheSplitThePlannerChoseForUnequalDevices) {
  const std::string dir = ::testing::TempDir() + "plan-to-train";
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  // Two one-device clusters; the first computes 3x faster, so it should take about 3 of gpt-tiny's 4 blocks.
  std::ofstream(dir + "/two.toml")
      << "[devices.fast]\npeak_tflops = { fp32 = 0.3 }\nmemory_gb = 4\n"
         "[devices.slow]\npeak_tflops = { fp32 = 0.1 }\nmemory_gb = 4\n"
         "[[clusters]]\nname = \"a\"\ndevice = \"fast\"\n[[clusters]]\nname = \"b\"\ndevice = \"slow\"\n"
         "[links.wan]\nlatency_us = 100\nbandwidth_gbps = 10\n";
  const std::string recipe = std::string(CROSSTRAIN_SOURCE_DIR) + "/recipes/gpt-tiny.toml";
  int status = 0;
  const std::string plan = run(std::string(CROSSTRAIN_BINARY) + " plan " + recipe + " " + dir +
                                   "/two.toml --nproc 2 --set parallel.pp=2 --set train.micro_batches=2 --json",
                               &status);
  ASSERT_EQ(status, 0) << plan;
  const auto j = nlohmann::json::parse(plan);
  std::string sets, split;
  for (const auto& o : j["overrides"]) {
    const std::string s = o.get<std::string>();
    if (s.rfind("parallel.stage_layers=", 0) == 0) split = s;
    sets += " --set '" + s + "'";
  }
  // Blocks cost 1 (the head ~2 x 256 x 128 / (12 x 128^2) = 0.17, the embedding 0.1): with the first device 3x as
  // fast, {3, 1} gives max(3.1/3, 1.17) = 1.17 where {2, 2} gives 2.17.
  EXPECT_EQ(split, "parallel.stage_layers=\"3,1\"") << plan;
  const std::string train =
      run(std::string(CROSSTRAIN_BINARY) + " train " + recipe + " --nproc 2" + sets +
              " --set train.steps=3 --set train.eval_every=100 --set train.sample_tokens=0 --set train.checkpoint_every=0"
              " --set run.log_every=1 --set run.dir=" + dir + "/run",
          &status);
  ASSERT_EQ(WEXITSTATUS(status), 0) << train;
  std::ifstream metrics(dir + "/run/metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(metrics, line);) rows += line.find("\"step\"") != std::string::npos;
  EXPECT_GE(rows, 3) << train;
}

}  // namespace
