#include "crosstrain/data/loss_mask.h"

namespace crosstrain::data {

LossMask LossMask::slice(size_t begin, size_t end) const {
  LossMask m = *this;
  m.data_ = data_ + begin;
  m.size_ = end - begin;
  return m;
}

namespace {

// Calls trained(t, yes) for each target t of the window at `offset`.
template <typename F>
void visit_window(const uint8_t* flags, int64_t offset, int64_t block_size, F&& trained) {
  const uint8_t* w = flags + offset;
  bool started = (w[0] & LossMask::kExampleStart) != 0;  // an example begins inside the window
  for (int64_t t = 0; t < block_size; ++t) {
    const uint8_t f = w[t + 1];  // the token target t predicts
    started = started || (f & LossMask::kExampleStart) != 0;
    trained(t, started && (f & LossMask::kTrained) != 0);
  }
}

}  // namespace

int64_t LossMask::apply(const std::vector<int64_t>& offsets, int64_t block_size, int64_t* targets) const {
  int64_t n = 0;
  for (size_t i = 0; i < offsets.size(); ++i) {
    int64_t* row = targets + static_cast<int64_t>(i) * block_size;
    visit_window(data_, offsets[i], block_size, [&](int64_t t, bool yes) {
      if (yes) ++n;
      else row[t] = kIgnoreTarget;
    });
  }
  return n;
}

int64_t LossMask::count(const std::vector<int64_t>& offsets, int64_t block_size) const {
  int64_t n = 0;
  for (int64_t offset : offsets) visit_window(data_, offset, block_size, [&](int64_t, bool yes) { n += yes; });
  return n;
}

std::vector<double> micro_batch_loss_weights(const std::vector<int64_t>& counts, int64_t micro_sequences,
                                             int64_t global_count, int64_t global_sequences) {
  // The trainer averages micro-batch losses over micro-batches and replicas, each a mean over its own trained
  // targets: weighting micro-batch m by count_m / (the mean count of a micro-batch of this size over the global
  // batch) turns that average into the global sum over the global count. A step with nothing to train: 0.
  std::vector<double> w(counts.size(), 0.0);
  if (global_count == 0) return w;
  const double mean_count = static_cast<double>(global_count) * static_cast<double>(micro_sequences) /
                            static_cast<double>(global_sequences);
  for (size_t m = 0; m < counts.size(); ++m) w[m] = static_cast<double>(counts[m]) / mean_count;
  return w;
}

}  // namespace crosstrain::data
