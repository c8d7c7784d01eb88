#include "crosstrain/recsys/metrics.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::recsys {

namespace {

void check_sizes(const char* metric, size_t scores, size_t labels) {
  if (scores != labels)
    throw Error(std::string(metric) + ": " + std::to_string(scores) + " scores but " + std::to_string(labels) +
                " labels; gather both over the same examples");
}

}  // namespace

// The Mann-Whitney statistic: sort by score, give each run of tied scores the mean of its ranks, and
// AUC = (sum of the positives' ranks - P (P + 1) / 2) / (P N). A tie between a positive and a negative then
// counts one half, as in the pairwise definition, in O(n log n) instead of O(P N).
double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  check_sizes("roc_auc", scores.size(), labels.size());
  for (size_t i = 0; i < scores.size(); ++i)
    if (std::isnan(scores[i]))
      throw Error("roc_auc: score " + std::to_string(i) + " is NaN; the model diverged or a prediction is missing");
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  double positive_ranks = 0, positives = 0;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin + 1;
    while (end < order.size() && scores[order[end]] == scores[order[begin]]) ++end;
    const double mean_rank = 0.5 * static_cast<double>(begin + 1 + end);  // ranks begin+1 .. end
    for (size_t i = begin; i < end; ++i)
      if (labels[order[i]] > 0.5f) positive_ranks += mean_rank, positives += 1;
    begin = end;
  }
  const double negatives = static_cast<double>(scores.size()) - positives;
  if (positives == 0 || negatives == 0) return 0.5;
  return (positive_ranks - positives * (positives + 1) / 2) / (positives * negatives);
}

// -log sigmoid(x) for a positive and -log(1 - sigmoid(x)) for a negative are both
// max(x, 0) - x y + log(1 + exp(-|x|)), which neither overflows nor loses the small terms for large |x|.
double log_loss(const std::vector<float>& logits, const std::vector<float>& labels) {
  check_sizes("log_loss", logits.size(), labels.size());
  if (logits.empty()) return 0;
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double x = logits[i], y = labels[i];
    sum += std::max(x, 0.0) - x * y + std::log1p(std::exp(-std::fabs(x)));
  }
  return sum / static_cast<double>(logits.size());
}

}  // namespace crosstrain::recsys
