// Metrics of binary click prediction: ROC AUC and log-loss. Pure; the trainer gathers predictions first.
#pragma once

#include <cstdint>
#include <vector>

namespace crosstrain::recsys {

// Area under the ROC curve of `scores` (any monotone score: logits or probabilities) against 0/1 `labels`:
// the probability that a random positive scores above a random negative, ties counting one half. 0.5 when
// either class is absent. O(n log n).
double roc_auc(const std::vector<float>& scores, const std::vector<float>& labels);

// Mean binary cross-entropy of `logits` against 0/1 `labels` (computed from logits, stable for large ones); 0 for
// no examples.
double log_loss(const std::vector<float>& logits, const std::vector<float>& labels);

}  // namespace crosstrain::recsys
