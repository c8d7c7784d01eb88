// A tiny training setup for tests: a small GPT over a generated English-like text file.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "crosstrain/train/config.h"

namespace crosstrain::testing {

inline std::string corpus_file() {
  auto path = std::filesystem::path(::testing::TempDir()) / "crosstrain_corpus.txt";
  if (!std::filesystem::exists(path)) {
    const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and",
                           "every", "good", "boy", "deserves", "fudge", "while", "time", "flies", "like", "an",
                           "arrow", "fruit", "banana", "train", "model", "rank", "gradient", "step"};
    std::ofstream out(path);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 12000; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out << words[x % (sizeof words / sizeof *words)] << ((x >> 20) % 9 == 0 ? ".\n" : " ");
    }
  }
  return path.string();
}

inline train::Config tiny_config(const std::string& tag) {
  train::Config c;
  c.run.name = tag;
  c.run.dir = (std::filesystem::path(::testing::TempDir()) / ("run_" + tag)).string();
  std::filesystem::remove_all(c.run.dir);
  c.run.seed = 1234;
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 32;
  c.model.vocab_size = 256;
  c.data.path = corpus_file();
  c.data.val_fraction = 0.1;
  c.train.steps = 20;
  c.train.global_batch = 8;
  c.train.lr = 3e-3;
  c.train.warmup_steps = 5;
  c.train.eval_every = 0;
  c.train.sample_tokens = 0;
  c.train.peak_flops_per_rank = 1e9;
  c.parallel.bucket_mb = 0.01;  // several buckets even for a tiny model
  return c;
}

}  // namespace crosstrain::testing
