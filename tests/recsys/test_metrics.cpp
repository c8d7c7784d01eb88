// ROC AUC and log-loss against their definitions: the pairwise count and the per-example formula.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/recsys/metrics.h"

using crosstrain::recsys::log_loss;
using crosstrain::recsys::roc_auc;

namespace {

// The definition: over every (positive, negative) pair, 1 when the positive scores higher, 1/2 on a tie.
double pairwise_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i)
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] != 1.0f || labels[j] != 0.0f) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  return wins / pairs;
}

}  // namespace

TEST(RocAuc, MatchesThePairwiseCountOnRandomDataWithTies) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 20; ++trial) {
    const int n = 50 + 37 * trial;
    const int levels = trial % 2 ? 5 : 1000;  // few distinct scores: many ties
    std::vector<float> scores(n), labels(n);
    for (int i = 0; i < n; ++i) {
      labels[i] = gen() % 3 == 0 ? 1.0f : 0.0f;
      scores[i] = static_cast<float>(gen() % levels) + (labels[i] ? 0.3f * (gen() % 4) : 0.0f);
    }
    EXPECT_NEAR(roc_auc(scores, labels), pairwise_auc(scores, labels), 1e-12) << "trial " << trial;
  }
}

TEST(RocAuc, KnownCases) {
  const std::vector<float> labels = {0, 0, 1, 0, 1, 1};
  EXPECT_DOUBLE_EQ(roc_auc({0.1f, 0.2f, 0.7f, 0.3f, 0.8f, 0.9f}, labels), 1.0);
  EXPECT_DOUBLE_EQ(roc_auc({0.9f, 0.8f, 0.1f, 0.7f, 0.2f, 0.3f}, labels), 0.0);
  EXPECT_DOUBLE_EQ(roc_auc(std::vector<float>(6, 2.5f), labels), 0.5);  // all tied
  // One of the 9 pairs inverted: positive 0.25 below negative 0.3.
  EXPECT_NEAR(roc_auc({0.1f, 0.2f, 0.25f, 0.3f, 0.8f, 0.9f}, labels), 8.0 / 9.0, 1e-12);
  EXPECT_DOUBLE_EQ(roc_auc({0.1f, 0.2f}, {1, 1}), 0.5);  // one class only
  EXPECT_DOUBLE_EQ(roc_auc({}, {}), 0.5);
}

TEST(RocAuc, RefusesMismatchedSizesAndNaN) {
  EXPECT_THROW(roc_auc({0.1f, 0.2f}, {1}), crosstrain::Error);
  EXPECT_THROW(roc_auc({0.1f, std::nanf("")}, {1, 0}), crosstrain::Error);
}

TEST(LogLoss, MatchesTheDirectFormula) {
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(500), labels(500);
  double direct = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    logits[i] = normal(gen);
    labels[i] = gen() % 2 ? 1.0f : 0.0f;
    const double p = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[i])));
    direct -= labels[i] ? std::log(p) : std::log(1.0 - p);
  }
  EXPECT_NEAR(log_loss(logits, labels), direct / logits.size(), 1e-9);
}

TEST(LogLoss, StableForLargeLogits) {
  // Confident and right: about exp(-100); confident and wrong: about 100 (not inf, not NaN).
  EXPECT_NEAR(log_loss({100.0f, -100.0f}, {1, 0}), std::exp(-100.0), 1e-50);
  EXPECT_NEAR(log_loss({-100.0f, 100.0f}, {1, 0}), 100.0, 1e-9);
  EXPECT_NEAR(log_loss({0.0f}, {1}), std::log(2.0), 1e-12);
  EXPECT_THROW(log_loss({0.0f}, {}), crosstrain::Error);
}
