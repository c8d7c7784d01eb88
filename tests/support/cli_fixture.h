// Helpers for tests that run `crosstrain train` as a user does: real processes, real files.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
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
inline std::vector<std::string> tiny_args(const std::string& dir, int nproc, int steps) {
  return {kBin, "train", kRecipes + "/gpt-tiny.toml", "--nproc", std::to_string(nproc),
          "--set", "run.dir=" + dir, "--set", "train.steps=" + std::to_string(steps),
          "--set", "model.n_layer=2", "--set", "model.n_embd=32", "--set", "model.block_size=32",
          "--set", "model.n_head=2", "--set", "train.global_batch=8", "--set", "data.path=" + corpus_file(),
          "--set", "train.sample_tokens=0", "--set", "train.eval_every=10", "--set", "parallel.bucket_mb=0.01",
          "--set", "train.peak_flops_per_rank=1e9", "--set", "train.warmup_steps=5"};
}


}  // namespace crosstrain::testing
