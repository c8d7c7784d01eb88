// The trainer on prompt/response JSONL: every layout (dp = 2, tp = 2 with and without sequence parallelism,
// pp = 2, gradient accumulation) gives the single process's losses step by step, although its micro-batches
// hold different numbers of trained targets, and the loss on the response tokens falls. Ranks are threads
// (in-process back end).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

// "What is a + b?\n" -> "c": prompts longer than responses, so most targets are masked and micro-batches hold
// unequal numbers of trained targets.
std::string arithmetic_jsonl() {
  const auto path = std::filesystem::path(::testing::TempDir()) / "crosstrain_sft_arith.jsonl";
  std::ofstream out(path);
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 400; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const int a = static_cast<int>(x % 50), b = static_cast<int>((x >> 8) % 50);
    out << "{\"prompt\": \"What is " << a << " + " << b << "?\\n\", \"response\": \"" << a + b << "\"}\n";
  }
  return path.string();
}

struct Layout {
  int dp = 1, tp = 1, pp = 1;
  int64_t micro_batches = 1;
  bool sequence_parallel = false;
};

std::vector<double> run_losses(const Layout& l, const std::string& tag, double* val_loss = nullptr,
                               std::string* sample = nullptr) {
  auto c = crosstrain::testing::tiny_config(tag);
  c.data.path = arithmetic_jsonl();
  c.model.n_layer = 2;
  c.model.n_head = 2;
  c.model.n_embd = 32;
  c.model.block_size = 32;
  c.train.steps = 8;
  c.train.global_batch = 8;
  c.train.eval_every = 8;
  c.train.eval_batches = 2;
  c.parallel.dp = l.dp;
  c.parallel.tp = l.tp;
  c.parallel.pp = l.pp;
  c.train.micro_batches = l.micro_batches;
  c.parallel.sequence_parallel = l.sequence_parallel;
  if (sample) c.train.sample_tokens = 6;
  std::vector<double> losses;
  std::mutex m;
  comm::FakeWorld::run(l.dp * l.tp * l.pp, [&](comm::Communicator& comm) {
    train::Trainer trainer(c, comm);
    train::TrainOptions o;
    o.quiet = true;
    auto r = trainer.run(o);
    std::lock_guard<std::mutex> lock(m);
    if (comm.rank() == 0) {
      for (const auto& s : r.steps) losses.push_back(s.loss);
      if (val_loss) *val_loss = r.val_loss;
      if (sample) *sample = r.sample;
    }
  }, comm::Millis(120000));
  return losses;
}

void expect_same(const std::vector<double>& want, const std::vector<double>& got, const std::string& what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-4 * std::abs(want[i])) << what << " step " << i;
}

}  // namespace

TEST(SftTrain, EveryLayoutGivesTheSingleProcessLosses) {
  double want_val = 0;
  std::string sample;
  const auto want = run_losses({}, "sft_single", &want_val, &sample);
  // The sample answers validation prompts beside the expected responses.
  EXPECT_NE(sample.find("What is "), std::string::npos) << sample;
  EXPECT_NE(sample.find("(expected: "), std::string::npos) << sample;
  ASSERT_EQ(want.size(), 8u);
  EXPECT_GT(want_val, 0);
  // The response tokens are learnable (digits, then the end token): the loss falls from about ln 256.
  EXPECT_NEAR(want.front(), std::log(256.0), 0.2);
  EXPECT_LT(want.back(), want.front() - 0.3);
  double val = 0;
  expect_same(want, run_losses({2, 1, 1, 1}, "sft_dp2", &val), "dp=2");
  EXPECT_NEAR(val, want_val, 1e-4 * want_val);
  expect_same(want, run_losses({1, 1, 1, 2}, "sft_accumulate2"), "micro_batches=2");
  expect_same(want, run_losses({1, 2, 1, 1}, "sft_tp2"), "tp=2");
  expect_same(want, run_losses({1, 2, 1, 1, true}, "sft_tp2_sp"), "tp=2 + sequence parallel");
  expect_same(want, run_losses({1, 1, 2, 2}, "sft_pp2"), "pp=2");
}
