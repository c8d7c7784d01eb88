// `crosstrain train` as a user runs it: real processes over Gloo, real files.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "cli_fixture.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;


// What it is and what it runs on, without a command: the version, libtorch's, and the CPU-only build of today.
TEST(TrainCli, VersionSaysWhatItRunsOn) {
  const auto res = run_process({kBin, "--version"}, {}, milliseconds(30000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_NE(res.output.find("crosstrain 0."), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("libtorch "), std::string::npos) << res.output;
  EXPECT_NE(res.output.find("CPU"), std::string::npos) << res.output;
}

TEST(TrainCli, RecipeOnTwoRanksWritesMetrics) {
  // The acceptance command: gpt-tiny as shipped, 30 steps, 2 ranks.
  auto dir = fresh_dir("tiny30");
  auto res = run_process({kBin, "train", kRecipes + "/gpt-tiny.toml", "--nproc", "2", "--set", "train.steps=30",
                          "--set", "run.dir=" + dir, "--set", "train.sample_tokens=40"},
                         {}, milliseconds(300000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  auto rows = read_metrics(dir);
  ASSERT_EQ(rows.size(), 30u);
  for (const auto& row : rows)
    for (const char* key : {"step", "loss", "lr", "tokens_per_s", "mfu", "step_time_s", "comm_time_s",
                            "exposed_comm_time_s"})
      EXPECT_TRUE(row.contains(key)) << key;
  EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>());
  EXPECT_GT(rows.back()["comm_time_s"].get<double>(), 0.0);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "config.toml"));
  EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "step_00000030" / "manifest.json"));
  EXPECT_TRUE(contains(res.output, "--- sample")) << res.output;
}

TEST(TrainCli, PipelineAndTensorParallelOnFourProcesses) {
  // The acceptance command: gpt-tiny with 2 pipeline stages x 2 tensor-parallel ranks over Gloo.
  auto dir = fresh_dir("pp2tp2");
  auto res = run_process({kBin, "train", kRecipes + "/gpt-tiny.toml", "--nproc", "4", "--set", "parallel.pp=2",
                          "--set", "parallel.tp=2", "--set", "train.steps=20", "--set", "run.dir=" + dir},
                         {}, milliseconds(300000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  auto rows = read_metrics(dir);
  ASSERT_EQ(rows.size(), 20u);
  EXPECT_LT(rows.back()["loss"].get<double>(), rows.front()["loss"].get<double>() - 0.5);
  for (const char* file : {"manifest.json", "rank-00000.safetensors", "rank-00001.safetensors", "rank-00002.safetensors",
                           "rank-00003.safetensors"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "step_00000020" / file)) << file;
}

TEST(TrainCli, GlooRanksMatchOneProcess) {
  auto one = fresh_dir("gloo_parity_1"), two = fresh_dir("gloo_parity_2"), ours = fresh_dir("gloo_parity_ring");
  auto r1 = run_process(tiny_args(one, 1, 20), {}, milliseconds(120000));
  ASSERT_EQ(r1.exit_code(), 0) << r1.output;
  auto r2 = run_process(tiny_args(two, 2, 20), {}, milliseconds(120000));
  ASSERT_EQ(r2.exit_code(), 0) << r2.output;
  // Our ring instead of the back end's collectives (comm.algo), under ZeRO-2: reduce-scatter, all-gather,
  // all-reduce and broadcast all go through it.
  auto ring_args = tiny_args(ours, 2, 20);
  ring_args.insert(ring_args.end(), {"--set", "comm.algo=ring", "--set", "parallel.zero=2"});
  auto r3 = run_process(ring_args, {}, milliseconds(120000));
  ASSERT_EQ(r3.exit_code(), 0) << r3.output;
  auto a = read_metrics(one), b = read_metrics(two), c = read_metrics(ours);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  ASSERT_EQ(c.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) {
    double x = a[i]["loss"], y = b[i]["loss"], z = c[i]["loss"];
    EXPECT_NEAR(y, x, 1e-5 * std::abs(x)) << "step " << i + 1;
    EXPECT_NEAR(z, x, 1e-5 * std::abs(x)) << "comm.algo=ring, step " << i + 1;
  }
}

TEST(TrainCli, ResumeContinuesExactlyLikeAnUninterruptedRun) {
  auto full = fresh_dir("resume_full"), part = fresh_dir("resume_part");
  auto args = tiny_args(full, 2, 20);
  args.insert(args.end(), {"--set", "train.checkpoint_every=10"});
  auto r = run_process(args, {}, milliseconds(120000));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  // An interrupted run: only the step-10 checkpoint and the first 10 metrics rows survived.
  fs::create_directories(fs::path(part) / "checkpoints");
  fs::copy(fs::path(full) / "checkpoints" / "step_00000010", fs::path(part) / "checkpoints" / "step_00000010");
  auto rows = read_metrics(full);
  {
    std::ofstream out(fs::path(part) / "metrics.jsonl");
    for (int i = 0; i < 13; ++i) out << rows[i].dump() << "\n";  // 3 rows past the checkpoint are replaced
  }
  auto resume = tiny_args(part, 2, 20);
  resume.insert(resume.end(), {"--set", "train.checkpoint_every=10", "--resume"});
  auto r2 = run_process(resume, {}, milliseconds(120000));
  ASSERT_EQ(r2.exit_code(), 0) << r2.output;
  EXPECT_TRUE(contains(r2.output, "resumed from")) << r2.output;
  auto resumed = read_metrics(part);
  ASSERT_EQ(resumed.size(), 20u);
  for (size_t i = 0; i < 20; ++i) {
    EXPECT_EQ(resumed[i]["step"], rows[i]["step"]);
    EXPECT_DOUBLE_EQ(resumed[i]["loss"].get<double>(), rows[i]["loss"].get<double>()) << "step " << i + 1;
  }
}

TEST(TrainCli, BadInputGetsOneClearLine) {
  auto dir = fresh_dir("bad_input");
  auto bad = [&](std::vector<std::string> extra, const std::string& expect, const std::string& config = "") {
    std::vector<std::string> args{kBin, "train", config.empty() ? kRecipes + "/gpt-tiny.toml" : config,
                                  "--set", "run.dir=" + dir};
    args.insert(args.end(), extra.begin(), extra.end());
    auto res = run_process(args, {}, milliseconds(60000));
    EXPECT_NE(res.exit_code(), 0) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << "expected '" << expect << "' in:\n" << res.output;
    EXPECT_FALSE(contains(res.output, "frame #")) << "a backtrace leaked:\n" << res.output;
    EXPECT_EQ(std::count(res.output.begin(), res.output.end(), '\n'), 1) << "one line expected:\n" << res.output;
  };
  bad({"--set", "train.lrate=1"}, "unknown key 'train.lrate'");
  bad({"--set", "train.lrate=1"}, "valid keys of [train]: steps");
  bad({"--set", "data.path=/nonexistent/corpus.txt"}, "data file '/nonexistent/corpus.txt' does not exist");
  bad({"--nproc", "2", "--set", "train.global_batch=7"}, "train.global_batch = 7 is not divisible by 2");
  bad({}, "cannot read config file", "/nonexistent/recipe.toml");
  bad({"--nproc", "4", "--set", "parallel.pp=3"}, "dp=1 x pp=3 x tp=1 = 3 does not match the 4 ranks");
  bad({"--nproc", "2", "--set", "parallel.tp=2", "--set", "model.n_head=3", "--set", "model.n_embd=96"},
      "n_head = 3 is not divisible by parallel.tp = 2");
  bad({"--nproc", "8", "--set", "parallel.pp=8"}, "only 4 layers");
  // The data is checked before the model is built: a context longer than the corpus gets a line, not an allocation.
  bad({"--set", "model.block_size=10000000", "--set", "train.global_batch=1"}, "too small for sequences of 10000000");
  // Beyond the model's bounds (issue 34: a config from elsewhere must not size tables): named, with the bound.
  bad({"--set", "model.block_size=100000000"}, "block_size = 100000000 is beyond crosstrain's bound of 16777216");
  bad({"--resume"}, "no checkpoint");
  bad({"--set", "comm.algo=fastest"}, "comm.algo = \"fastest\" is not an algorithm; use builtin, ring");

  // A corrupt checkpoint: flip bytes inside a tensor of a real one.
  auto args = tiny_args(dir, 1, 2);
  auto ok = run_process(args, {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  auto weights = fs::path(dir) / "checkpoints" / "step_00000002" / "rank-00000.safetensors";
  {
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(weights) - 64));
    f.write("garbage!garbage!", 16);
  }
  args.push_back("--resume");
  auto res = run_process(args, {}, milliseconds(60000));
  EXPECT_NE(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, weights.string())) << res.output;
  EXPECT_TRUE(contains(res.output, "checksum")) << res.output;
  // Truncated.
  fs::resize_file(weights, 100);
  res = run_process(args, {}, milliseconds(60000));
  EXPECT_NE(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "truncated")) << res.output;
}

TEST(TrainCli, BadValuesAndResumingPastTheEndAreRefusedBeforeAnyRankStarts) {
  auto dir = fresh_dir("bad_values");
  auto refused = [&](std::vector<std::string> extra, const std::string& expect) {
    auto args = tiny_args(dir, 2, 4);
    args.insert(args.end(), extra.begin(), extra.end());
    auto res = run_process(args, {}, milliseconds(60000));
    EXPECT_EQ(res.exit_code(), 2) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << "expected '" << expect << "' in:\n" << res.output;
    // One line from the launching process: no rank was started to repeat it.
    EXPECT_EQ(std::count(res.output.begin(), res.output.end(), '\n'), 1) << res.output;
    EXPECT_FALSE(contains(res.output, "[rank")) << res.output;
  };
  refused({"--set", "train.lr=inf"}, "train.lr");
  refused({"--set", "train.warmup_steps=-1"}, "train.warmup_steps = -1");
  refused({"--set", "train.grad_clip=-1"}, "train.grad_clip = -1");
  refused({"--set", "train.checkpoint_every=-1"}, "train.checkpoint_every = -1");
  refused({"--set", "comm.timeout_s=0"}, "comm.timeout_s = 0");
  refused({"--set", "train.global_batch=0"}, "train.global_batch = 0");
  refused({"--set", "data.path=/dev/zero"}, "data.path '/dev/zero' is not a regular file or a folder");

  // Resuming a 4-step run with train.steps = 2 would train -2 steps: refused, and nothing changes.
  auto ok = run_process(tiny_args(dir, 2, 4), {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  refused({"--resume", "--set", "train.steps=2"}, "is at step 4 but train.steps = 2; set train.steps to 4 or more");
  EXPECT_EQ(read_metrics(dir).size(), 4u);
}

// sync.cluster_batch that does not fit the run: exit 2 from the launcher, one line naming the key and the fix.
TEST(TrainCli, ClusterBatchThatDoesNotFitIsRefusedNamingTheKey) {
  auto dir = fresh_dir("bad_cluster_batch");
  auto refused = [&](const std::string& mode, const std::string& counts, const std::string& expect) {
    auto args = tiny_args(dir, 2, 2);
    for (const std::string& set : std::vector<std::string>{"sync.mode=" + mode, "sync.clusters=2",
                                                           "sync.cluster_batch=" + counts, "train.micro_batches=2"})
      args.insert(args.end(), {"--set", set});
    auto res = run_process(args, {}, milliseconds(60000));
    EXPECT_EQ(res.exit_code(), 2) << res.output;
    EXPECT_TRUE(contains(res.output, "sync.cluster_batch = \"" + counts + "\"")) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << "expected '" << expect << "' in:\n" << res.output;
    EXPECT_EQ(std::count(res.output.begin(), res.output.end(), '\n'), 1) << res.output;
  };
  refused("diloco", "6,4", "adds up to 10 sequences but train.global_batch = 8");
  refused("diloco", "4,2,2", "gives 3 counts for sync.clusters = 2");
  refused("sync", "6,2", "needs sync.mode = \"diloco\"");
  refused("diloco", "5,3", "not divisible by its 1 data-parallel ranks x 2 micro-batches");
  refused("diloco", "6,x", "must be positive sequence counts");
}

TEST(TrainCli, TextThatLooksBinaryIsTrainedOnWithAWarning) {
  auto dir = fresh_dir("binary_text");
  const auto data = fs::path(::testing::TempDir()) / "looks_binary.txt";
  {
    std::ofstream out(data, std::ios::binary);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 20000; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out.put(static_cast<char>(x & 0xFF));
    }
  }
  auto args = tiny_args(dir, 1, 2);
  args.insert(args.end(), {"--set", "data.path=" + data.string()});
  auto res = run_process(args, {}, milliseconds(60000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "warning: data '" + data.string() + "' does not look like text")) << res.output;
}
