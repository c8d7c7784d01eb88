// Cross-entropy with masked targets (-100): the single-device GPT's loss and the vocabulary-parallel one
// against a hand computation and torch's ignore_index, at tp = 1 and tp = 2 (ranks as threads).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/data/loss_mask.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/parallel/tensor_parallel.h"

using namespace crosstrain;

namespace {

constexpr int64_t kIgnore = data::kIgnoreTarget;

// log-sum-exp(row) - row[target], averaged over rows whose target is not ignored; written out in doubles.
double hand_masked_ce(const at::Tensor& logits, const std::vector<int64_t>& targets) {
  const auto l = logits.to(at::kDouble).contiguous();
  double total = 0;
  int counted = 0;
  for (int64_t r = 0; r < l.size(0); ++r) {
    if (targets[r] == kIgnore) continue;
    double sum = 0;
    for (int64_t v = 0; v < l.size(1); ++v) sum += std::exp(l[r][v].item<double>());
    total += std::log(sum) - l[r][targets[r]].item<double>();
    ++counted;
  }
  return total / counted;
}

struct Case {
  at::Tensor logits, targets;
  std::vector<int64_t> target_list;
};

Case make_case() {
  auto gen = at::detail::createCPUGenerator(5);
  Case c;
  c.logits = torch::randn({6, 8}, gen) * 2;
  c.target_list = {3, kIgnore, 7, kIgnore, kIgnore, 0};
  c.targets = torch::tensor(c.target_list, torch::kLong);
  return c;
}

}  // namespace

TEST(MaskedCrossEntropy, SingleDeviceMatchesHandAndTorch) {
  const Case c = make_case();
  const double hand = hand_masked_ce(c.logits, c.target_list);
  auto ours_in = c.logits.clone().requires_grad_(true);
  auto ours = parallel::tp::vocab_parallel_cross_entropy(ours_in, c.targets, 0, nullptr);
  auto torch_in = c.logits.clone().requires_grad_(true);
  auto theirs = torch::nn::functional::cross_entropy(
      torch_in, c.targets, torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
  EXPECT_NEAR(ours.item<double>(), hand, 1e-5);
  EXPECT_NEAR(theirs.item<double>(), hand, 1e-5);
  // Masking matters: the unmasked mean over rows with the ignored targets replaced by real ones differs.
  auto unmasked = torch::nn::functional::cross_entropy(c.logits, c.targets.clamp_min(0));
  EXPECT_GT(std::abs(unmasked.item<double>() - hand), 1e-3);
  ours.backward();
  theirs.backward();
  EXPECT_TRUE(torch::allclose(ours_in.grad(), torch_in.grad(), 1e-5, 1e-7));
  // Ignored rows get no gradient.
  EXPECT_EQ(ours_in.grad()[1].abs().sum().item<double>(), 0.0);
}

TEST(MaskedCrossEntropy, EverythingIgnoredIsZeroNotNaN) {
  auto logits = torch::randn({3, 4}).requires_grad_(true);
  auto loss = parallel::tp::vocab_parallel_cross_entropy(logits, torch::full({3}, kIgnore, torch::kLong), 0, nullptr);
  EXPECT_EQ(loss.item<double>(), 0.0);
  loss.backward();
  EXPECT_EQ(logits.grad().abs().sum().item<double>(), 0.0);
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    auto mine = torch::randn({3, 2}).requires_grad_(true);
    auto l = parallel::tp::vocab_parallel_cross_entropy(mine, torch::full({3}, kIgnore, torch::kLong),
                                                        comm.rank() * 2, &comm);
    EXPECT_EQ(l.item<double>(), 0.0);
    l.backward();
    EXPECT_EQ(mine.grad().abs().sum().item<double>(), 0.0);
  });
}

TEST(MaskedCrossEntropy, VocabParallelTp2MatchesSingleDevice) {
  const Case c = make_case();
  auto full = c.logits.clone().requires_grad_(true);
  auto want = parallel::tp::vocab_parallel_cross_entropy(full, c.targets, 0, nullptr);
  want.backward();
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    auto mine = c.logits.chunk(2, 1)[comm.rank()].clone().requires_grad_(true);
    // [2, 3] targets: the shape the model passes ([batch, sequence]) is flattened like the logits' rows.
    auto loss = parallel::tp::vocab_parallel_cross_entropy(mine.view({2, 3, 4}), c.targets.view({2, 3}),
                                                           comm.rank() * 4, &comm);
    EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-6);
    EXPECT_NEAR(loss.item<double>(), hand_masked_ce(c.logits, c.target_list), 1e-5);
    loss.backward();
    EXPECT_TRUE(torch::allclose(mine.grad(), full.grad().chunk(2, 1)[comm.rank()], 1e-5, 1e-7));
  });
}

TEST(MaskedCrossEntropy, GptLossIgnoresMaskedTargets) {
  models::GPTConfig config;
  config.n_layer = 1;
  config.n_head = 2;
  config.n_embd = 16;
  config.block_size = 6;
  config.vocab_size = 8;
  models::GPT gpt(config, 1);
  gpt->eval();
  const Case c = make_case();
  auto tokens = torch::tensor({1, 2, 3, 4, 5, 6}, torch::kLong).view({1, 6});
  auto logits = gpt->forward(tokens).detach().view({6, 8});
  EXPECT_NEAR(gpt->loss(tokens, c.targets.view({1, 6})).item<double>(), hand_masked_ce(logits, c.target_list), 1e-5);
}
