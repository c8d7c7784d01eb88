// `crosstrain train` on the DLRM recipe as a user runs it: real processes over Gloo, real files. The recipe
// learns the synthetic task on 4 ranks (AUC well above chance), its checkpoint resumes on 2 ranks and exports
// as safetensors, and bad settings are refused with a message that names the key.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <regex>
#include <utility>

#include "crosstrain/checkpoint/safetensors.h"
#include "subprocess.h"
#include "scratch.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kRecipe = CT_SOURCE_DIR "/recipes/dlrm-synthetic.toml";

std::string fresh(const std::string& name) { return crosstrain::testing::scratch_path("dlrm-cli-" + name).string(); }

std::vector<std::string> train_args(const std::string& dir, int nproc, int steps) {
  return {kBin, "train", kRecipe, "--nproc", std::to_string(nproc), "--set", "run.dir=" + dir,
          "--set", "train.steps=" + std::to_string(steps), "--set", "train.eval_every=0", "--set", "run.log_every=10"};
}

// Sends SIGINT once `seen` is printed and waits for the run to end: its result (a gtest failure unless it ended
// with 130) and the step it says it stopped after (-1 when it does not say).
std::pair<ProcessResult, int> interrupt_once(Process& job, const std::string& seen) {
  EXPECT_TRUE(job.wait_for_output(seen, std::chrono::milliseconds(180000))) << "never printed " << seen;
  job.signal(SIGINT);
  ProcessResult stopped = job.wait(std::chrono::milliseconds(120000));
  EXPECT_FALSE(stopped.timed_out);
  EXPECT_EQ(stopped.exit_code(), 128 + SIGINT) << stopped.output;
  std::smatch at;
  if (!std::regex_search(stopped.output, at, std::regex("interrupted \\(SIGINT\\) after step ([0-9]+) of")))
    return {stopped, -1};
  const int step = std::stoi(at[1]);
  return {stopped, step};
}

std::vector<nlohmann::json> metrics_rows(const std::string& dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

double last_auc(const std::string& output) {
  std::smatch m;
  std::string::const_iterator from = output.begin();
  double auc = -1;
  const std::regex re("val auc ([0-9.]+)");
  while (std::regex_search(from, output.end(), m, re)) {
    auc = std::stod(m[1]);
    from = m.suffix().first;
  }
  return auc;
}

}  // namespace

TEST(DlrmCli, RecipeLearnsOnFourRanksResumesOnTwoAndExports) {
  const std::string dir = fresh("recipe");
  auto first = run_process(train_args(dir, 4, 60), {}, std::chrono::milliseconds(240000));
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  EXPECT_TRUE(contains(first.output, "table 0: ")) << "the planner's placement of each table is shown";
  const double auc = last_auc(first.output);
  EXPECT_GT(auc, 0.65) << first.output;  // chance is 0.5; the planted signal allows about 0.8

  auto more = train_args(dir, 2, 70);
  more.push_back("--resume");
  auto second = run_process(more, {}, std::chrono::milliseconds(240000));
  ASSERT_EQ(second.exit_code(), 0) << second.output;
  EXPECT_TRUE(contains(second.output, "step 70/70")) << second.output;
  EXPECT_FALSE(contains(second.output, "step 10/70")) << "a resumed run continues after its checkpoint";

  const std::string file = dir + "/export.safetensors";
  auto exported = run_process({kBin, "ckpt", "export", dir, "--out", file});
  ASSERT_EQ(exported.exit_code(), 0) << exported.output;
  crosstrain::checkpoint::SafetensorsReader reader(file);
  EXPECT_EQ(reader.shape("embeddings.t0.weight"), (std::vector<int64_t>{400000, 16}));
  EXPECT_EQ(reader.shape("embeddings.t7.weight"), (std::vector<int64_t>{50, 16}));
  EXPECT_TRUE(reader.has("dense.top.0.weight"));
  auto hf = run_process({kBin, "ckpt", "export", "--format", "hf", dir, "--out", dir + "/hf"});
  EXPECT_NE(hf.exit_code(), 0);
  EXPECT_TRUE(contains(hf.output, "no Hugging Face layout")) << hf.output;
  fs::remove_all(dir);
}

TEST(DlrmCli, BadSettingsAreRefusedNamingTheKey) {
  const std::string dir = fresh("bad");
  struct Case {
    std::vector<std::string> sets;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"dlrm.tables=\"1000,ab\""}, "dlrm.tables"},
      {{"dlrm.sharding=\"diagonal\""}, "dlrm.sharding"},
      {{"sync.mode=ssp"}, "dlrm.mode = \"ps\""},
      {{"train.global_batch=1023"}, "train.global_batch"},
      {{"dlrm.mode=ps", "sync.mode=ssp", "dlrm.ps_storage=mmap", "dlrm.memory_budget_mb=1", "dlrm.cache_rows=100000"},
       "dlrm.cache_rows"},
      {{"dlrm.memory_budget_mb=1"}, "budget"},
  };
  for (const auto& c : cases) {
    auto args = train_args(dir, 2, 5);
    for (const auto& s : c.sets) args.insert(args.end(), {"--set", s});
    auto r = run_process(args);
    EXPECT_NE(r.exit_code(), 0) << c.expect;
    EXPECT_TRUE(contains(r.output, c.expect)) << c.expect << ":\n" << r.output;
    EXPECT_FALSE(fs::exists(dir + "/checkpoints")) << "a refused run writes nothing";
  }
  fs::remove_all(dir);
}

// Workers of the parameter server drift apart under ssp, yet a Ctrl-C stops them after the same step (one before a
// vote is read: every sync.staleness + 1 = 5 steps), saves the tables there, and the run resumes from it.
TEST(DlrmCli, CtrlCOnTheParameterServerStopsEveryWorkerAfterTheSameStepAndSaves) {
  const std::string dir = fresh("ps_stop");
  auto args = train_args(dir, 2, 100000);
  args.insert(args.end(), {"--set", "dlrm.mode=ps", "--set", "sync.mode=ssp", "--set", "run.log_every=1",
                           "--set", "train.checkpoint_every=100000"});
  Process job(args);
  const auto [stopped, step] = interrupt_once(job, "step 6/100000");
  ASSERT_GE(step, 0) << stopped.output;
  EXPECT_EQ(step % 5, 4) << stopped.output;
  char last[32];
  std::snprintf(last, sizeof last, "step_%08d", step);
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/" + last + "/manifest.json")) << "the step it stopped after is saved";
  auto resume_args = args;
  resume_args[std::find(resume_args.begin(), resume_args.end(), "train.steps=100000") - resume_args.begin()] =
      "train.steps=" + std::to_string(step + 2);
  resume_args.push_back("--resume");
  auto resumed = run_process(resume_args, {}, std::chrono::milliseconds(180000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/checkpoints/" + last)) << resumed.output;
  fs::remove_all(dir);
}

// DLRM runs through the one training loop (train/loop.h): it records traces, its metrics rows carry the common
// fields, `crosstrain report` renders it, and Ctrl-C stops every rank between steps with the resume command.
TEST(DlrmCli, RunsThroughTheCommonLoopTracesReportsAndStopsOnCtrlC) {
  const std::string dir = fresh("loop");
  auto args = train_args(dir, 4, 100000);
  args.insert(args.end(), {"--set", "train.checkpoint_every=5", "--set", "run.log_every=1"});
  Process job(args);
  const auto [stopped, step] = interrupt_once(job, "step 7/100000");
  ASSERT_GE(step, 0) << stopped.output;
  char last[32];
  std::snprintf(last, sizeof last, "step_%08d", step);
  EXPECT_TRUE(fs::exists(dir + "/checkpoints/" + last + "/manifest.json")) << "the step it stopped after is saved";
  EXPECT_TRUE(contains(stopped.output, "The newest checkpoint is " + dir + "/checkpoints/step_0000000"))
      << stopped.output;
  EXPECT_TRUE(contains(stopped.output, "--resume")) << stopped.output;

  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(fs::exists(dir + "/traces/rank-" + std::to_string(r) + ".json")) << "rank " << r << " wrote no trace";
  std::ifstream rows(dir + "/metrics.jsonl");
  std::string line;
  int count = 0;
  while (std::getline(rows, line)) {
    ++count;
    for (const char* field : {"\"step\"", "\"loss\"", "\"lr\"", "\"tokens_per_s\"", "\"step_time_s\"",
                              "\"comm_time_s\"", "\"exposed_comm_time_s\"", "\"time_s\"", "\"peak_rss_bytes\"",
                              "\"sync_mode\"", "\"examples_per_s\"", "\"embedding_bytes_sent\""})
      EXPECT_TRUE(contains(line, field)) << field << " missing from " << line;
  }
  EXPECT_GE(count, 7);

  auto report = run_process({kBin, "report", dir}, {}, std::chrono::milliseconds(120000));
  EXPECT_EQ(report.exit_code(), 0) << report.output;
  EXPECT_TRUE(contains(report.output, "throughput")) << report.output;
  EXPECT_FALSE(contains(report.output, "no traces")) << report.output;

  // The printed command continues the run (with fewer steps to keep the test short).
  auto resume_args = train_args(dir, 4, 12);
  resume_args.push_back("--resume");
  auto resumed = run_process(resume_args, {}, std::chrono::milliseconds(180000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "step 12/12")) << resumed.output;
  fs::remove_all(dir);
}

// DLRM under elastic training (issue 33, item 3): its tables are sharded over every rank, so the whole job is one
// replica and no other holds a lost rank's shards: a SIGKILLed rank takes the job back to its newest checkpoint,
// by itself, and training continues exactly as the run without the failure. The parameter-server mode goes back
// to the checkpoint the same way (its servers start again from the loaded rows and dense parameters).
TEST(DlrmCli, ALostRankUnderElasticTrainingGoesBackToTheCheckpointAndContinuesExactly) {
  const std::string plain = fresh("elastic-plain"), elastic = fresh("elastic-kill");
  auto args = [](const std::string& dir) {
    auto a = train_args(dir, 2, 16);
    a.insert(a.end(), {"--set", "train.checkpoint_every=5", "--set", "run.log_every=4"});
    return a;
  };
  auto p = run_process(args(plain), {}, std::chrono::milliseconds(180000));
  ASSERT_EQ(p.exit_code(), 0) << p.output;
  auto e_args = args(elastic);
  e_args.insert(e_args.end(), {"--max-restarts", "2", "--set", "debug.elastic_kill=1@8", "--set",
                               "elastic.heartbeat_ms=50", "--set", "elastic.failure_timeout_ms=400"});
  auto e = run_process(e_args, {}, std::chrono::milliseconds(180000));
  ASSERT_EQ(e.exit_code(), 0) << e.output;
  EXPECT_TRUE(contains(e.output, "(failure): 0 replicas (), 0 ranks; rank 0 left with its replica 0; rank 1 exited"))
      << e.output;
  EXPECT_TRUE(contains(e.output, "no live replica holds the state: resumed from the newest checkpoint")) << e.output;
  EXPECT_TRUE(contains(e.output, "step_00000005 (step 5)")) << e.output;
  const auto a = metrics_rows(plain), b = metrics_rows(elastic);
  ASSERT_EQ(a.size(), 16u);
  ASSERT_EQ(b.size(), 16u) << e.output;  // every step once: steps 6-7 were redone, their first rows replaced
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(b[i]["step"].get<int>(), static_cast<int>(i) + 1);
    EXPECT_NEAR(a[i]["loss"].get<double>(), b[i]["loss"].get<double>(), 1e-6) << "step " << i + 1;
  }

  const std::string ps_dir = fresh("elastic-ps");
  auto ps = args(ps_dir);
  ps.insert(ps.end(), {"--max-restarts", "2", "--set", "debug.elastic_kill=1@8", "--set", "elastic.heartbeat_ms=50",
                       "--set", "elastic.failure_timeout_ms=400", "--set", "dlrm.mode=ps", "--set", "sync.mode=ssp"});
  auto s = run_process(ps, {}, std::chrono::milliseconds(180000));
  ASSERT_EQ(s.exit_code(), 0) << s.output;
  EXPECT_TRUE(contains(s.output, "no live replica holds the state: resumed from the newest checkpoint")) << s.output;
  EXPECT_TRUE(contains(s.output, "step_00000005 (step 5)")) << s.output;
  const auto c = metrics_rows(ps_dir);
  ASSERT_EQ(c.size(), 16u) << s.output;
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(c[i]["step"].get<int>(), static_cast<int>(i) + 1);
}
