// `crosstrain config`: the config a run would get, as a user asks for it. Real processes, no training.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include "cli_fixture.h"
#include "scratch.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

ProcessResult config(std::vector<std::string> args) {
  args.insert(args.begin(), {kBin, "config"});
  return run_process(args, {}, milliseconds(60000));
}

// The line of `key = ...` in [section] of a printed config.
std::string line_of(const std::string& text, const std::string& section, const std::string& key) {
  const auto start = text.find("[" + section + "]\n");
  if (start == std::string::npos) return "";
  const auto at = text.find("\n" + key + " = ", start);
  if (at == std::string::npos) return "";
  return text.substr(at + 1, text.find('\n', at + 1) - at - 1);
}

}  // namespace

TEST(ConfigCli, PrintsEveryKeyWithItsHelpWhatItTakesAndItsDefault) {
  const auto res = config({kRecipes + "/gpt-tiny.toml", "--set", "train.steps=7", "--set", "sync.mode=diloco"});
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  const std::string steps = line_of(res.output, "train", "steps");
  EXPECT_NE(steps.find("steps = 7"), std::string::npos) << steps;
  EXPECT_NE(steps.find("# optimizer steps of the run [integer; default 100]"), std::string::npos) << steps;
  const std::string mode = line_of(res.output, "sync", "mode");
  EXPECT_NE(mode.find("[one of sync, diloco, ssp, async, gossip; default 'sync']"), std::string::npos) << mode;
  EXPECT_NE(line_of(res.output, "dlrm", "mode").find("one of sharded, ps"), std::string::npos) << res.output;
  for (const char* section : {"run", "model", "data", "train", "parallel", "comm", "sync", "elastic", "obs", "dlrm",
                              "debug"})
    EXPECT_NE(res.output.find(std::string("[") + section + "]"), std::string::npos) << section;
  // A short DiLoCo run: both notices, as comments.
  EXPECT_NE(res.output.find("# notice: train.steps = 7 ends inside the"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("# notice: train.steps = 7 ends before DiLoCo's first outer step"), std::string::npos)
      << res.output;
}

TEST(ConfigCli, WhatItPrintsIsARecipeThatReadsBackToTheSameConfig) {
  const auto first = config({kRecipes + "/gpt-tiny.toml", "--set", "train.steps=9", "--set", "dlrm.pooling=mean"});
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  const fs::path saved = scratch_dir("config-cli") / "printed.toml";
  std::ofstream(saved) << first.output;
  const auto again = config({saved.string()});
  ASSERT_EQ(again.exit_code(), 0) << again.output;
  // Only the first line (which names the recipe) differs.
  EXPECT_EQ(first.output.substr(first.output.find('\n')), again.output.substr(again.output.find('\n')));
}

TEST(ConfigCli, NprocResolvesTheLayoutOrRefusesIt) {
  auto res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "4", "--set", "parallel.tp=2"});
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_NE(res.output.find("# resolved for 4 ranks: dp 2 x pp 1 x tp 2"), std::string::npos) << res.output;
  res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "3", "--set", "train.global_batch=4"});
  EXPECT_EQ(res.exit_code(), 2) << res.output;
  EXPECT_NE(res.output.find("train.global_batch = 4"), std::string::npos) << res.output;
}

TEST(ConfigCli, AKeyInTheWrongSectionIsNamedWithTheRightOne) {
  const auto res = config({"--set", "train.log_every=5"});
  EXPECT_EQ(res.exit_code(), 2) << res.output;
  EXPECT_NE(res.output.find("did you mean 'run.log_every'?"), std::string::npos) << res.output;
}

TEST(ConfigCli, MoreRanksThanCoresIsNoticed) {
  const auto res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "256", "--set", "train.global_batch=256"});
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_NE(res.output.find("# notice: 256 ranks x 1 compute thread on "), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("the MFU reads low"), std::string::npos) << res.output;
  const auto fits = config({kRecipes + "/gpt-tiny.toml", "--nproc", "1"});
  EXPECT_EQ(fits.output.find("the MFU reads low"), std::string::npos) << fits.output;
}

TEST(ConfigCli, EveryOptionsHelpShowsItsDefault) {
  // CLI11 prints the default after the type and its check: "INT:N>=1=1".
  for (const auto& [command, shown] : std::vector<std::pair<std::string, std::string>>{
           {"train", "INT:N>=1=1"}, {"config", "INT:NONNEGATIVE=0"}, {"run", "INT:N>=1=1"}}) {
    const auto res = run_process({kBin, command, "--help"}, {}, milliseconds(30000));
    EXPECT_EQ(res.exit_code(), 0) << res.output;
    const auto at = res.output.find("--nproc");
    ASSERT_NE(at, std::string::npos) << res.output;
    const std::string line = res.output.substr(at, res.output.find('\n', at) - at);
    EXPECT_NE(line.find(shown), std::string::npos) << command << ": " << line;
  }
}

TEST(ConfigCli, TheReferencePageIsWhatTheConfigReaderKnows) {
  const auto res = run_process({kBin, "config", "--reference"}, {}, milliseconds(30000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  std::ifstream in(CT_SOURCE_DIR "/docs/config-reference.md");
  const std::string page((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(page, res.output) << "docs/config-reference.md is out of date: build/crosstrain config --reference > "
                                 "docs/config-reference.md";
  // Every key has a line of help: no row ends in an empty cell.
  std::istringstream rows(res.output);
  int keys = 0;
  for (std::string row; std::getline(rows, row);) {
    if (row.rfind("| `", 0) != 0) continue;
    ++keys;
    EXPECT_EQ(row.find("|  |"), std::string::npos) << row;
    EXPECT_GT(row.size() - row.rfind(" | ") , 6u) << row;
  }
  EXPECT_GT(keys, 100) << res.output;
  EXPECT_NE(res.output.find("| `micro_batches` | integer | `1` |"), std::string::npos) << res.output;
  const auto mixed = run_process({kBin, "config", "--reference", "--set", "train.steps=3"}, {}, milliseconds(30000));
  EXPECT_EQ(mixed.exit_code(), 2) << mixed.output;
}

TEST(ConfigCli, MicroBatchesHaveOneNameAndTheOldOneSaysWhichItIs) {
  const auto old = config({"--set", "parallel.microbatches=4"});
  EXPECT_EQ(old.exit_code(), 2) << old.output;
  EXPECT_NE(old.output.find("'parallel.microbatches' in --set parallel.microbatches=4 is now train.micro_batches"),
            std::string::npos)
      << old.output;
  // A pipeline takes its micro-batches from train.micro_batches, at least one per stage.
  auto res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "2", "--set", "parallel.pp=2", "--set",
                     "train.micro_batches=4"});
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_NE(res.output.find("dp 1 x pp 2 x tp 1, ZeRO 0, 4 micro-batches per step"), std::string::npos) << res.output;
  res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "2", "--set", "parallel.pp=2"});
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_NE(res.output.find("dp 1 x pp 2 x tp 1, ZeRO 0, 2 micro-batches per step"), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("# notice: train.micro_batches = 1 is raised to 2 for a 2-stage pipeline"),
            std::string::npos)
      << res.output;
  res = config({kRecipes + "/gpt-tiny.toml", "--nproc", "2", "--set", "parallel.pp=2", "--set",
                "parallel.schedule=interleaved", "--set", "train.micro_batches=3", "--set", "model.n_layer=4"});
  EXPECT_EQ(res.exit_code(), 2) << res.output;
  EXPECT_NE(res.output.find("(train.micro_batches = 3, parallel.pp = 2)"), std::string::npos) << res.output;
}
