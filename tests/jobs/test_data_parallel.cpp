// Data parallelism against the single-process reference, with ranks as threads (in-process back end).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <fstream>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/parallel/grad_reducer.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

struct TrainRun {
  std::vector<double> losses;
  std::vector<float> parameters;
};

TrainRun train_with(int dp, int64_t micro_batches, const std::string& tag) {
  train::Config config = crosstrain::testing::tiny_config(tag);
  config.train.micro_batches = micro_batches;
  TrainRun run;
  std::mutex m;
  comm::FakeWorld::run(dp, [&](comm::Communicator& c) {
    train::Trainer trainer(config, c);
    train::TrainOptions options;
    options.quiet = true;
    train::ParameterDump dump;
    options.dump = &dump;
    auto result = trainer.run(options);
    if (c.rank() == 0) {
      std::lock_guard<std::mutex> lock(m);
      for (const auto& s : result.steps) run.losses.push_back(s.loss);
      run.parameters = std::move(dump.flat);
    }
  });
  return run;
}

void expect_same(const TrainRun& got, const TrainRun& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " step " << i + 1;
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < want.parameters.size(); ++i)
    worst = std::max(worst, std::abs(double(got.parameters[i]) - want.parameters[i]) / std::max(1.0, std::abs(double(want.parameters[i]))));
  EXPECT_LE(worst, 1e-5) << what << ": largest parameter difference";
}

}  // namespace

TEST(DataParallelParity, OneTwoAndFourRanksTrainTheSameModel) {
  TrainRun one = train_with(1, 1, "dp1");
  ASSERT_EQ(one.losses.size(), 20u);
  EXPECT_LT(one.losses.back(), one.losses.front());  // it learns
  expect_same(train_with(2, 1, "dp2"), one, "2 ranks");
  expect_same(train_with(4, 1, "dp4"), one, "4 ranks");
}

TEST(DataParallelParity, GradientAccumulationMatches) {
  TrainRun one = train_with(1, 1, "acc1");
  expect_same(train_with(2, 2, "acc2"), one, "2 ranks x 2 micro-batches");
  expect_same(train_with(1, 4, "acc4"), one, "1 rank x 4 micro-batches");
}

// A user's own module: the reducer needs nothing from the GPT.
struct Net : torch::nn::Module {
  torch::nn::Linear a{nullptr}, b{nullptr}, unused{nullptr};
  Net() {
    a = register_module("a", torch::nn::Linear(8, 16));
    b = register_module("b", torch::nn::Linear(16, 4));
    unused = register_module("unused", torch::nn::Linear(4, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) { return b(torch::relu(a(x))); }
};

TEST(BucketedAllReduce, AveragesGradientsOfAnyModuleWithUnusedParameters) {
  const int dp = 3;
  auto gen = at::detail::createCPUGenerator(5);
  auto inputs = torch::randn({dp * 4, 8}, gen), targets = torch::randn({dp * 4, 4}, gen);
  Net reference;
  torch::mse_loss(reference.forward(inputs), targets).backward();

  comm::FakeWorld::run(dp, [&](comm::Communicator& c) {
    Net net;
    {
      torch::NoGradGuard no_grad;  // same initial weights as the reference
      auto ref = reference.named_parameters();
      for (auto& p : net.named_parameters()) p.value().copy_(ref[p.key()]);
    }
    // 64-byte buckets: many buckets. (The unused layer is registered last, so its buckets come first in
    // launch order and nothing can start before the end of backward: see the GPT test for overlap.)
    parallel::BucketedAllReduce reducer(net.parameters(), &c, parallel::BucketConfig{64});
    EXPECT_GT(reducer.bucket_count(), 3);
    auto x = inputs.slice(0, c.rank() * 4, (c.rank() + 1) * 4), y = targets.slice(0, c.rank() * 4, (c.rank() + 1) * 4);
    // Two micro-batches of 2: accumulate without communicating, then sync.
    for (int m = 0; m < 2; ++m) {
      reducer.set_sync(m == 1);
      auto loss = torch::mse_loss(net.forward(x.slice(0, 2 * m, 2 * m + 2)), y.slice(0, 2 * m, 2 * m + 2)) / 2.0;
      loss.backward();  // the averaged gradients are in place when this returns
    }
    auto ref = reference.named_parameters();
    for (const auto& p : net.named_parameters()) {
      if (p.key().rfind("unused", 0) == 0) {
        EXPECT_EQ(p.value().grad().abs().sum().item<float>(), 0.0f);
        continue;
      }
      EXPECT_TRUE(torch::allclose(p.value().grad(), ref[p.key()].grad(), 1e-5, 1e-6))
          << p.key() << " on rank " << c.rank();
    }
    EXPECT_GT(reducer.stats().comm_time_s, 0.0);
    reducer.zero_grad();
    for (const auto& p : net.parameters()) EXPECT_EQ(p.grad().abs().sum().item<float>(), 0.0f);
  });
}

TEST(BucketedAllReduce, StartsBucketsWhileBackwardRuns) {
  // A GPT's gradients arrive in reverse layer order: all but the last bucket start during backward.
  comm::FakeWorld::run(2, [](comm::Communicator& c) {
    models::GPTConfig config;
    config.n_layer = 4;
    config.n_embd = 32;
    config.n_head = 2;
    config.block_size = 16;
    models::GPT model(config, 1);
    parallel::BucketedAllReduce reducer(model->parameters(), &c, parallel::BucketConfig{16 << 10});
    ASSERT_GT(reducer.bucket_count(), 4);
    auto x = torch::randint(0, 256, {2, 16}), y = torch::randint(0, 256, {2, 16});
    model->loss(x, y).backward();
    EXPECT_GE(reducer.stats().started_during_backward, reducer.bucket_count() - 2);
    EXPECT_GT(reducer.stats().comm_time_s, 0.0);
  });
}

TEST(CompressedDataParallel, Int8WithErrorFeedbackTracksUncompressedTraining) {
  auto run = [](const std::string& codec, std::vector<double>& losses, int64_t& sent, int64_t& plain) {
    train::Config config = crosstrain::testing::tiny_config("compressed_" + codec.substr(0, 4));
    config.comm.compression = codec;
    config.parallel.bucket_mb = 1.0;
    std::mutex m;
    comm::FakeWorld::run(2, [&](comm::Communicator& c) {
      train::Trainer trainer(config, c);
      train::TrainOptions o;
      o.quiet = true;
      auto r = trainer.run(o);
      if (c.rank() == 0) {
        std::lock_guard<std::mutex> lock(m);
        for (const auto& s : r.steps) losses.push_back(s.loss);
      }
    });
    std::ifstream in(config.run.dir + "/metrics.jsonl");
    std::string last, line;
    while (std::getline(in, line)) last = line;
    auto row = nlohmann::json::parse(last);
    sent = row["comm_bytes"];
    plain = row["comm_bytes_uncompressed"];
  };
  std::vector<double> plain_losses, int8_losses;
  int64_t sent = 0, plain = 0, s0 = 0, p0 = 0;
  run("none", plain_losses, s0, p0);
  run("int8", int8_losses, sent, plain);
  EXPECT_EQ(s0, p0);
  EXPECT_GT(static_cast<double>(plain) / static_cast<double>(sent), 3.0);
  ASSERT_EQ(int8_losses.size(), plain_losses.size());
  EXPECT_NEAR(int8_losses.back(), plain_losses.back(), 0.02 * plain_losses.back());
  EXPECT_LT(int8_losses.back(), int8_losses.front());
}
