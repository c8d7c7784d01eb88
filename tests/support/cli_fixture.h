// Helpers for tests that run `crosstrain train` as a user does: real processes, real files.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "subprocess.h"
#include "train_fixture.h"

namespace crosstrain::testing {

inline const std::string kBin = CT_CROSSTRAIN_BIN;
inline const std::string kRecipes = CT_SOURCE_DIR "/recipes";

inline std::vector<nlohmann::json> read_metrics(const std::string& dir) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

// The newest step metrics.jsonl holds while a run writes it (a line being written is skipped); -1 before any.
inline int64_t last_logged_step(const std::string& dir) {
  int64_t step = -1;
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const auto row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_object() && row.contains("step")) step = row["step"].get<int64_t>();
  }
  return step;
}

// Signals a running `crosstrain train` once its metrics.jsonl reaches `step` (within 90 s; a gtest failure if it
// never does) and waits for it to end (at most 90 s).
inline ProcessResult signal_at_step(Process& job, const std::string& dir, int64_t step, int signal) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
  while (last_logged_step(dir) < step && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GE(last_logged_step(dir), step) << "the run never reached step " << step;
  job.signal(signal);
  return job.wait(std::chrono::milliseconds(90000));
}

// The step an interrupted run says it stopped after ("interrupted (SIGTERM) after step 12 of 2000"), -1 when it
// does not say so; and the checkpoint directory name of a step.
inline int stopped_after(const std::string& output, const std::string& signal_name) {
  std::smatch stop;
  if (!std::regex_search(output, stop, std::regex("interrupted \\(" + signal_name + "\\) after step ([0-9]+) of")))
    return -1;
  return std::stoi(stop[1]);
}
inline std::string step_dir_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step_%08d", step);
  return name;
}

// `args` with `extra` appended (a command line with a few more options).
inline std::vector<std::string> with(std::vector<std::string> args, const std::vector<std::string>& extra) {
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

inline std::string fresh_dir(const std::string& name) {
  auto d = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove_all(d);
  return d.string();
}

// The tiny test model on the generated corpus, as --set overrides of the gpt-tiny recipe.
// Node `node` of a 2-node job (`crosstrain run`, one rank, in cluster `node`) meeting at 127.0.0.1:PORT, running
// `train` (a crosstrain command such as tiny_args'; its --nproc is the launcher's, so it is dropped).
inline std::vector<std::string> two_node_run(int node, int port, std::vector<std::string> train) {
  for (size_t i = 0; i + 1 < train.size(); ++i)
    if (train[i] == "--nproc") {
      train.erase(train.begin() + static_cast<std::ptrdiff_t>(i), train.begin() + static_cast<std::ptrdiff_t>(i) + 2);
      break;
    }
  std::vector<std::string> args = {kBin, "run", "--nnodes", "2", "--node-rank", std::to_string(node), "--nproc", "1",
                                   "--cluster", std::to_string(node), "--master", "127.0.0.1:" + std::to_string(port),
                                   "--"};
  args.insert(args.end(), train.begin(), train.end());
  return args;
}

inline std::vector<std::string> tiny_args(const std::string& dir, int nproc, int steps) {
  return {kBin, "train", kRecipes + "/gpt-tiny.toml", "--nproc", std::to_string(nproc),
          "--set", "run.dir=" + dir, "--set", "train.steps=" + std::to_string(steps),
          "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.block_size=32",
          "--set", "model.n_head=2", "--set", "train.global_batch=8", "--set", "data.path=" + corpus_file(),
          "--set", "train.sample_tokens=0", "--set", "train.eval_every=10", "--set", "parallel.bucket_mb=0.01",
          "--set", "train.peak_flops_per_rank=1e9", "--set", "train.warmup_steps=5"};
}


}  // namespace crosstrain::testing
