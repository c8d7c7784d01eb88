// ZeRO-1/2/3 against plain data parallel through the trainer: same seed, same global batch, 20 steps; losses
// within 1e-5 (relative) and final parameters within 1e-5, at dp=2, dp=4 and dp=2 x tp=2 (with and without
// sequence parallelism). The bytes each rank holds follow the ZeRO formulas. Ranks are threads.
// Also: the gradient-hook engine both reducers use, and ZeRO-3's gathered-parameter peak.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/parallel/grad_hooks.h"
#include "crosstrain/parallel/grad_reducer.h"
#include "crosstrain/parallel/zero.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

struct TrainedRun {
  std::vector<double> losses;
  std::vector<std::map<std::string, at::Tensor>> shards;  // per rank
  nlohmann::json last_metrics;
};

TrainedRun train_with(int dp, int tp, int zero, bool sequence_parallel, const std::string& tag, int64_t micro_batches = 1,
                      const std::string& precision = "fp32", int pp = 1, int dp_shard = 0) {
  auto c = crosstrain::testing::tiny_config(tag);
  c.model.n_layer = 3;
  c.model.n_head = 2;
  c.parallel.dp = dp;
  c.parallel.tp = tp;
  c.parallel.pp = pp;
  c.parallel.zero = zero;
  c.parallel.dp_shard = dp_shard;
  c.parallel.sequence_parallel = sequence_parallel;
  c.train.micro_batches = micro_batches;
  c.train.precision = precision;
  TrainedRun run;
  run.shards.resize(dp * tp * pp);
  std::mutex m;
  comm::FakeWorld::run(dp * tp * pp, [&](comm::Communicator& comm) {
    train::Trainer trainer(c, comm);
    train::TrainOptions o;
    o.quiet = true;
    train::ParameterDump dump;
    o.dump = &dump;
    auto r = trainer.run(o);
    std::lock_guard<std::mutex> lock(m);
    run.shards[comm.rank()] = std::move(dump.shards);
    if (comm.rank() == 0)
      for (const auto& s : r.steps) run.losses.push_back(s.loss);
  });
  std::ifstream in(std::filesystem::path(c.run.dir) / "metrics.jsonl");
  for (std::string line; std::getline(in, line);) run.last_metrics = nlohmann::json::parse(line);
  return run;
}

void expect_same_training(const TrainedRun& plain, const TrainedRun& zero, const std::string& what) {
  ASSERT_EQ(plain.losses.size(), zero.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i)
    EXPECT_NEAR(zero.losses[i], plain.losses[i], 1e-5 * std::abs(plain.losses[i])) << what << " step " << i + 1;
  for (size_t r = 0; r < plain.shards.size(); ++r)
    for (const auto& [name, p] : plain.shards[r]) {
      ASSERT_TRUE(zero.shards[r].count(name)) << name;
      EXPECT_LT((zero.shards[r].at(name) - p).abs().max().item<double>(), 1e-5) << what << " rank " << r << " " << name;
    }
}

class ZeroParity : public ::testing::TestWithParam<std::tuple<int, int, bool>> {};

TEST_P(ZeroParity, MatchesPlainDataParallel) {
  const auto [dp, tp, sp] = GetParam();
  const std::string tag = "zero_dp" + std::to_string(dp) + "_tp" + std::to_string(tp) + (sp ? "_sp" : "");
  TrainedRun plain = train_with(dp, tp, 0, sp, tag + "_plain");
  ASSERT_EQ(plain.losses.size(), 20u);
  EXPECT_LT(plain.losses.back(), plain.losses.front() - 0.5);
  const double psi = plain.last_metrics.at("param_bytes").get<double>() / 4;  // rank 0's parameters
  EXPECT_NEAR(plain.last_metrics.at("model_state_bytes").get<double>() / psi, 16.0, 1.6);
  for (int stage = 1; stage <= 3; ++stage) {
    TrainedRun z = train_with(dp, tp, stage, sp, tag + "_z" + std::to_string(stage));
    expect_same_training(plain, z, "ZeRO-" + std::to_string(stage));
    // fp32 Adam: stage 1 holds 4 + 4 + 8/N bytes per parameter, stage 2 4 + 12/N, stage 3 16/N.
    const double formula = stage == 1 ? 8 + 8.0 / dp : stage == 2 ? 4 + 12.0 / dp : 16.0 / dp;
    const double measured = z.last_metrics.at("model_state_bytes").get<double>() / psi;
    EXPECT_NEAR(measured, formula, 0.1 * formula) << "ZeRO-" << stage << " at dp=" << dp;
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, ZeroParity,
                         ::testing::Values(std::make_tuple(2, 1, false), std::make_tuple(4, 1, false),
                                           std::make_tuple(2, 2, false), std::make_tuple(2, 2, true)));

// HSDP: ZeRO inside groups of 2 of the 4 data-parallel ranks, two copies of the state; the gradients of each
// slice are averaged over the copies after the reduce-scatter. Same training as plain data parallel, and each rank
// holds the state of a ZeRO over 2 ranks (not 4).
TEST(Zero, HybridShardingMatchesPlainDataParallel) {
  TrainedRun plain = train_with(4, 1, 0, false, "hsdp_plain");
  const double psi = plain.last_metrics.at("param_bytes").get<double>() / 4;
  for (int stage = 1; stage <= 3; ++stage) {
    TrainedRun z = train_with(4, 1, stage, false, "hsdp_z" + std::to_string(stage), 1, "fp32", 1, 2);
    expect_same_training(plain, z, "HSDP ZeRO-" + std::to_string(stage));
    const double formula = stage == 1 ? 8 + 8.0 / 2 : stage == 2 ? 4 + 12.0 / 2 : 16.0 / 2;
    EXPECT_NEAR(z.last_metrics.at("model_state_bytes").get<double>() / psi, formula, 0.1 * formula) << stage;
  }
  // With accumulation (stage 1 reduces once per step) and with tensor parallelism inside each copy.
  expect_same_training(train_with(4, 1, 0, false, "hsdp_accum_plain", 2),
                       train_with(4, 1, 1, false, "hsdp_accum_z1", 2, "fp32", 1, 2), "HSDP accumulating");
  expect_same_training(train_with(2, 2, 0, false, "hsdp_tp_plain"),
                       train_with(2, 2, 2, false, "hsdp_tp_z2", 1, "fp32", 1, 1), "HSDP dp_shard=1 x tp=2");
}

TEST(Zero, GradientAccumulationMatchesPlain) {
  TrainedRun plain = train_with(2, 1, 0, false, "zero_accum_plain", 2);
  for (int stage : {1, 3}) expect_same_training(plain, train_with(2, 1, stage, false, "zero_accum_" + std::to_string(stage), 2), "accumulating");
}

TEST(Zero, StagesOneAndTwoWorkUnderPipelineStages) {
  TrainedRun plain = train_with(2, 1, 0, false, "zero_pp_plain", 1, "fp32", 2);
  for (int stage : {1, 2})
    expect_same_training(plain, train_with(2, 1, stage, false, "zero_pp_" + std::to_string(stage), 1, "fp32", 2),
                         "pp=2, ZeRO-" + std::to_string(stage));
}

TEST(Zero, Bf16MixedPrecisionTrainsWithThePapersByteCounts) {
  TrainedRun plain = train_with(2, 1, 0, false, "zero_bf16_plain");
  const double psi = plain.last_metrics.at("param_bytes").get<double>() / 4;
  for (int stage = 1; stage <= 3; ++stage) {
    TrainedRun z = train_with(2, 1, stage, false, "zero_bf16_z" + std::to_string(stage), 1, "bf16");
    ASSERT_EQ(z.losses.size(), plain.losses.size());
    // bf16 arithmetic: the same curve within a few percent, not bit for bit.
    EXPECT_NEAR(z.losses.back(), plain.losses.back(), 0.03 * plain.losses.back()) << "ZeRO-" << stage;
    EXPECT_LT(z.losses.back(), z.losses.front() - 0.5);
    // 2 bytes of bf16 parameters, 2 of gradients, 12 of fp32 master weights and moments, sharded per stage.
    const double formula = stage == 1 ? 4 + 12.0 / 2 : stage == 2 ? 2 + 14.0 / 2 : 16.0 / 2;
    EXPECT_NEAR(z.last_metrics.at("model_state_bytes").get<double>() / psi, formula, 0.1 * formula) << "ZeRO-" << stage;
  }
}

TEST(ReducerLogic, BusySecondsIsTheUnionOfTheIntervals) {
  using std::chrono::milliseconds;
  const auto t0 = std::chrono::steady_clock::now();
  // [0, 10) and [5, 20) overlap: 20 ms; [30, 40) adds 10; [32, 35) inside it adds nothing.
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::chrono::steady_clock::time_point>> intervals{
      {t0, t0 + milliseconds(10)}, {t0 + milliseconds(5), t0 + milliseconds(20)},
      {t0 + milliseconds(30), t0 + milliseconds(40)}, {t0 + milliseconds(32), t0 + milliseconds(35)}};
  EXPECT_NEAR(parallel::busy_seconds(intervals), 0.030, 1e-9);
  EXPECT_EQ(parallel::busy_seconds({}), 0.0);
}

TEST(ZeroLogic, OwnedPartsCoverEachParameterOnce) {
  const std::vector<int64_t> sizes{5, 3, 9};  // 17 elements, padded to 18 over 3 ranks: slices of 6
  EXPECT_EQ(parallel::zero_padded_size(17, 3), 18);
  EXPECT_EQ(parallel::zero_padded_size(0, 4), 0);
  std::vector<int64_t> covered(3, 0);
  for (int r = 0; r < 3; ++r)
    for (const auto& part : parallel::owned_parts(sizes, {r * 6, (r + 1) * 6})) {
      EXPECT_GE(part.param_offset, 0);
      EXPECT_LE(part.param_offset + part.size, sizes[part.param]);
      EXPECT_LE(part.shard_offset + part.size, 6);
      covered[part.param] += part.size;
    }
  EXPECT_EQ(covered, sizes);
  auto middle = parallel::owned_parts(sizes, {6, 12});  // parameter 1 whole, the first 4 of parameter 2
  ASSERT_EQ(middle.size(), 2u);
  EXPECT_EQ(middle[0].param, 1u);
  EXPECT_EQ(middle[0].shard_offset, 0);
  EXPECT_EQ(middle[1].param, 2u);
  EXPECT_EQ(middle[1].param_offset, 0);
  EXPECT_EQ(middle[1].size, 4);
}

TEST(ZeroLogic, AdamWUpdateMatchesTorchBitForBit) {
  torch::manual_seed(3);
  auto p = torch::randn({7, 5}, torch::requires_grad());
  auto q = p.detach().clone().reshape(-1);
  torch::optim::AdamW adam({p}, torch::optim::AdamWOptions(0.01).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  auto m = torch::zeros({35}), v = torch::zeros({35});
  parallel::AdamWHyper h{0.01, 0.9, 0.95, 1e-8, 0.1};
  for (int step = 1; step <= 5; ++step) {
    auto g = torch::randn({7, 5});
    p.mutable_grad() = g.clone();
    adam.step();
    // In two slices, as ZeRO would hold it on two ranks.
    parallel::adamw_update(q.narrow(0, 0, 20), g.reshape(-1).narrow(0, 0, 20), m.narrow(0, 0, 20), v.narrow(0, 0, 20), step, h, true);
    parallel::adamw_update(q.narrow(0, 20, 15), g.reshape(-1).narrow(0, 20, 15), m.narrow(0, 20, 15), v.narrow(0, 20, 15), step, h, true);
  }
  EXPECT_TRUE(torch::equal(p.detach().reshape(-1), q));
}

// Stage 3 on a chain of equal units: the parameters gathered at once stay within three units (the one computing,
// the prefetched neighbour and, in backward, the one whose gradients are still being reduced), far below the
// whole model. Ranks are threads.
TEST(Zero, Stage3GathersOnlyAFewUnitsAtOnce) {
  constexpr int kUnits = 8, kWidth = 16;
  constexpr int64_t kUnitBytes = (kWidth * kWidth + kWidth) * 4;  // fp32 weight and bias; even, so no padding at dp=2
  comm::FakeWorld::run(2, [&](comm::Communicator& c) {
    auto gen = at::detail::createCPUGenerator(11);
    std::vector<torch::nn::Linear> layers;
    std::vector<std::vector<parallel::ZeroParam>> units;
    for (int i = 0; i < kUnits; ++i) {
      layers.emplace_back(kWidth, kWidth);
      torch::NoGradGuard no_grad;  // the same weights on both ranks
      layers.back()->weight.copy_(torch::randn({kWidth, kWidth}, gen) * 0.3);
      layers.back()->bias.zero_();
      units.push_back({{layers.back()->weight, true}, {layers.back()->bias, false}});
    }
    parallel::ZeroConfig config;
    config.stage = 3;
    parallel::ZeroOptimizer zero(units, &c, config);
    ASSERT_EQ(zero.unit_count(), kUnits);
    auto x = torch::randn({4, kWidth}, gen), y = torch::randn({4, kWidth}, gen);
    std::vector<double> losses;
    for (int step = 0; step < 5; ++step) {
      torch::Tensor h = x;
      for (int i = 0; i < kUnits; ++i) {
        zero.before_unit(i);
        h = zero.after_unit(i, torch::tanh(layers[i](h)));
      }
      torch::Tensor loss = torch::mse_loss(h, y);
      loss.backward();  // reduces each unit's gradients and releases it; the end of backward waits for the rest
      zero.step(1e-2);
      zero.zero_grad();
      losses.push_back(loss.item<double>());
    }
    const int64_t peak = zero.memory().gathered_peak;
    EXPECT_GE(peak, 2 * kUnitBytes) << "a unit and the prefetched next one are gathered together";
    EXPECT_LE(peak, 3 * kUnitBytes) << "the whole model is " << kUnits * kUnitBytes << " bytes";
    EXPECT_LT(losses.back(), losses.front());
  });
}

// The engine behind both reducers: one on_ready per accumulated gradient, one end-of-backward call per pass that
// counted, none for a pass whose gradients did not count (accumulation without sync).
TEST(GradientHooks, OneEndOfBackwardCallPerCountedPass) {
  auto a = torch::randn({3}, torch::requires_grad()), b = torch::randn({3}, torch::requires_grad());
  std::vector<size_t> ready;
  int ends = 0;
  bool counts = true;
  std::optional<parallel::GradientHooks> hooks;
  hooks.emplace(
      std::vector<at::Tensor>{a, b},
      [&](size_t i) {
        ready.push_back(i);
        return counts;
      },
      [&] {
        ++ends;
        hooks->end_pass();
      });
  (a * b).sum().backward();
  EXPECT_EQ(ready.size(), 2u);
  EXPECT_EQ(ends, 1);
  EXPECT_FALSE(hooks->in_pass());
  counts = false;
  (a * b).sum().backward();
  EXPECT_EQ(ready.size(), 4u);
  EXPECT_EQ(ends, 1);
  EXPECT_FALSE(hooks->in_pass());
  counts = true;
  (a * 2).sum().backward();  // only a's gradient: still one call at the end
  EXPECT_EQ(ready.size(), 5u);
  EXPECT_EQ(ends, 2);
}

// Adds a post-hook to the accumulator of `p` after the ones registered so far; the engine runs a node's
// post-hooks in registration order, so it runs after the reducer's has queued the end-of-backward callback.
void after_reducer_hook(const at::Tensor& p, std::function<void()> fn) {
  torch::autograd::impl::grad_accumulator(p)->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
      [fn = std::move(fn)](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
        fn();
        return outputs;
      }));
}

// The owner goes away in the middle of a backward pass, after its end-of-backward callback was queued: the
// callback must do nothing (it would call into a destroyed reducer). Deterministic: the destroying hook runs
// right after ours on the same accumulator. A graph built before the owner went away fires nothing either.
TEST(GradientHooks, DoNothingOnceTheOwnerIsGone) {
  auto w = torch::randn({3}, torch::requires_grad());
  int ready = 0, ends = 0;
  std::optional<parallel::GradientHooks> hooks;
  auto attach = [&] {
    hooks.emplace(std::vector<at::Tensor>{w}, [&](size_t) { return ++ready > 0; }, [&] { ++ends; });
  };
  attach();
  after_reducer_hook(w, [&] { hooks.reset(); });
  (w * 3).sum().backward();
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(ends, 0) << "the end-of-backward callback ran after its owner was destroyed";

  attach();
  auto loss = (w * 3).sum();
  hooks.reset();
  loss.backward();
  EXPECT_EQ(ready, 1);
  EXPECT_EQ(ends, 0);
}

// The same for the two reducers: destroyed while a syncing backward runs, the backward still completes.
// (Without the guard the callback calls finish() on the destroyed object: undefined behaviour, which here
// dereferences the reducer's emptied hooks_, so it crashes rather than fails; the test above is the exact one.)
TEST(GradientHooks, ReducersDestroyedDuringBackward) {
  torch::nn::Linear net(4, 2);
  std::optional<parallel::BucketedAllReduce> bucketed;
  bucketed.emplace(net->parameters(), nullptr, parallel::BucketConfig{16});
  after_reducer_hook(net->weight, [&] { bucketed.reset(); });
  after_reducer_hook(net->bias, [&] { bucketed.reset(); });
  net(torch::randn({3, 4})).sum().backward();
  EXPECT_FALSE(bucketed.has_value());

  torch::nn::Linear other(4, 2);
  std::optional<parallel::ZeroOptimizer> zero;
  zero.emplace(std::vector<std::vector<parallel::ZeroParam>>{{{other->weight, true}, {other->bias, false}}}, nullptr,
               parallel::ZeroConfig{2});
  after_reducer_hook(other->weight, [&] { zero.reset(); });
  after_reducer_hook(other->bias, [&] { zero.reset(); });
  other(torch::randn({3, 4})).sum().backward();
  EXPECT_FALSE(zero.has_value());
}

}  // namespace
