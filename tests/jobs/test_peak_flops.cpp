// The MFU denominator (src/jobs/gpt/peak_flops.h): which products are timed for a model, and what is reported.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/models/parallel_plan.h"
#include "peak_flops.h"

namespace crosstrain::train {
namespace {

models::GPTConfig gpt_tiny() {  // recipes/gpt-tiny.toml's model
  models::GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 128;
  c.block_size = 128;
  c.vocab_size = 256;
  return c;
}

TEST(GemmPeak, ShapesAreTheModelsForwardProducts) {
  // gpt-tiny on 2 ranks: 16 sequences / 2 replicas / 1 micro-batch = 8 sequences of 128 tokens.
  const auto shapes = gpt_gemm_shapes(gpt_tiny(), 8 * 128);
  ASSERT_EQ(shapes.size(), 5u);
  std::vector<std::string> described;
  for (const auto& s : shapes) described.push_back(s.describe());
  EXPECT_EQ(described, (std::vector<std::string>{"qkv 1024x128x384", "proj 1024x128x128", "mlp_up 1024x128x512",
                                                 "mlp_down 1024x512x128", "head 1024x128x256"}));
  EXPECT_TRUE(shapes[0].bias);
  EXPECT_FALSE(shapes[4].bias);  // lm_head has no bias
  EXPECT_DOUBLE_EQ(shapes[0].flops(), 2.0 * 1024 * 128 * 384);
}

TEST(GemmPeak, FollowsTheConfig) {
  models::GPTConfig c = gpt_tiny();
  c.n_embd = 64;
  c.vocab_size = 50304;
  const auto shapes = gpt_gemm_shapes(c, 3 * 32);
  EXPECT_EQ(shapes[3].describe(), "mlp_down 96x256x64");
  EXPECT_EQ(shapes[4].describe(), "head 96x64x50304");
}

TEST(GemmPeak, NoTokensIsAUsageError) { EXPECT_THROW(gpt_gemm_shapes(gpt_tiny(), 0), UsageError); }

// Timing is not checked, only that the best is the best of what was measured, in both compute dtypes.
TEST(GemmPeak, BestIsTheHighestMeasuredRate) {
  at::set_num_threads(1);
  models::GPTConfig c = gpt_tiny();
  c.n_embd = 32;
  c.vocab_size = 64;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const GemmPeak peak = measure_gemm_peak(c, 64, dtype, 0.002);
    ASSERT_EQ(peak.by_shape.size(), 5u);
    double best = 0;
    std::string best_shape;
    for (const auto& [shape, flops] : peak.by_shape) {
      EXPECT_GT(flops, 0) << shape;
      if (flops > best) best = flops, best_shape = shape;
    }
    EXPECT_EQ(peak.best_flops, best);
    EXPECT_EQ(peak.best_shape, best_shape);
    EXPECT_EQ(peak.by_shape[0].first, "qkv 64x32x96");
    EXPECT_EQ(describe(peak).rfind("best ", 0), 0u) << describe(peak);
  }
}

TEST(GemmPeak, ProcessesOfOneHostTakeTurnsAndALockHeldTooLongIsGivenUpOn) {
  const std::string lock = ::testing::TempDir() + "/gemm-peak-turns.lock";
  std::remove(lock.c_str());
  // Three "ranks" measure at once; each measurement takes 100 ms: with turns, no two overlap.
  using Clock = std::chrono::steady_clock;
  std::vector<std::pair<Clock::time_point, Clock::time_point>> spans(3);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      measure_in_turns_per_host(
          [&] {
            spans[r].first = Clock::now();
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
            spans[r].second = Clock::now();
            return GemmPeak{};
          },
          lock);
    });
  for (auto& t : ranks) t.join();
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first) << "turns " << i - 1 << ", " << i;
  // A lock someone keeps: the rank waits `wait`, then measures anyway.
  const int holder = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(holder, 0);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0);
  const auto start = Clock::now();
  bool measured = false;
  measure_in_turns_per_host([&] { measured = true; return GemmPeak{}; }, lock, std::chrono::milliseconds(200));
  EXPECT_TRUE(measured);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(200));
  ::close(holder);
  // A link planted where the lock goes is not followed.
  std::remove(lock.c_str());
  const std::string target = ::testing::TempDir() + "/gemm-peak-target";
  { std::ofstream(target) << "x"; }
  ::chmod(target.c_str(), 0600);
  ASSERT_EQ(::symlink(target.c_str(), lock.c_str()), 0);
  measure_in_turns_per_host([] { return GemmPeak{}; }, lock, std::chrono::milliseconds(50));
  struct stat st {};
  ASSERT_EQ(::stat(target.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::remove(lock.c_str());
}

TEST(TrainingFlops, FrozenMatricesLoseTheirWeightGradientAndAdaptersAddTheirOwn) {
  models::GPTConfig c = gpt_tiny();
  const models::ParallelPlan plan(c);
  // Nothing frozen: PaLM's 6 N + 12 L T d.
  EXPECT_DOUBLE_EQ(models::training_flops_per_token(plan, c, {}), c.flops_per_token());
  // The head frozen (the final LayerNorm's gain and bias, and the d x vocab matrix): 4 per parameter, not 6.
  const auto head = models::frozen_parameters(plan, c, "head");
  EXPECT_DOUBLE_EQ(models::training_flops_per_token(plan, c, head), c.flops_per_token() - 2.0 * (2 * 128 + 128 * 256));
  // The embedding frozen: lookups were never counted, so nothing changes.
  const auto embedding = models::frozen_parameters(plan, c, "embedding");
  EXPECT_DOUBLE_EQ(models::training_flops_per_token(plan, c, embedding), c.flops_per_token());
  // LoRA with the rest frozen: 4 per base parameter that multiplies, 6 per adapter parameter (rank 8 on the fused
  // qkv projection of each of the 4 blocks: A is 8 x 128, B 384 x 8).
  c.lora_rank = 8;
  const models::ParallelPlan lora_plan(c);
  const auto all = models::frozen_parameters(lora_plan, c, "");
  const double multiplying = (c.flops_per_token() - 12.0 * c.n_layer * c.block_size * c.n_embd) / 6.0;
  const double adapters = 4.0 * (8 * 128 + 384 * 8);
  EXPECT_DOUBLE_EQ(models::training_flops_per_token(lora_plan, c, all),
                   c.flops_per_token() - 2.0 * multiplying + 6.0 * adapters);
}

}  // namespace
}  // namespace crosstrain::train
