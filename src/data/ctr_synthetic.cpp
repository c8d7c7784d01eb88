// The synthetic click log: Zipf ids, log-count dense features and labels drawn from a planted logistic model.
//
// Every value is a hash of (seed, stream, example, field), so example i is the same whichever rank makes it and
// in whatever slices. The task is shared by the two streams (the hidden weights hash only the seed); the streams
// differ in their key, so the held-out examples are other draws than the training ones.
//
// The planted logit of an example is
//   signal * (S + D) / sqrt(parts) + bias,
//   S = sum over tables t of (sum of the hidden weights w[t][id] of its ids / sqrt(multi_hot)) / sqrt(#tables),
//   D = sum over dense features f of v[f] * (x_f - mean_f) / sd_f / sqrt(#dense),
// with hidden weights uniform in [-sqrt 3, sqrt 3] (variance 1), so S and D have about unit variance and `signal`
// is the standard deviation of the informative part of the logit. The bias is set so that the mean click
// probability over a calibration sample is click_rate.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/data/ctr.h"
#include "ctr_random.h"

namespace crosstrain::data {

namespace {

using namespace ctr_random;

// What a hash stands for; part of every key so that no two kinds of value share bits.
enum Kind : uint64_t { kSparseId = 1, kDense = 2, kLabel = 3, kRowWeight = 4, kDenseWeight = 5, kScramble = 6 };
enum Stream : uint64_t { kTrain = 0x747261696e, kHeldOut = 0x76616c, kCalibration = 0x63616c };
constexpr int64_t kCalibrationExamples = 8192;  // enough for the bias and the dense moments to a few 1e-3
const double kSqrt3 = std::sqrt(3.0);

std::string compact_count(double n) {
  char text[32];
  if (n >= 1e9) std::snprintf(text, sizeof text, "%.3gB", n / 1e9);
  else if (n >= 1e6) std::snprintf(text, sizeof text, "%.3gM", n / 1e6);
  else if (n >= 1e3) std::snprintf(text, sizeof text, "%.3gK", n / 1e3);
  else std::snprintf(text, sizeof text, "%.0f", n);
  return text;
}

void check_config(const SyntheticCtrConfig& c) {
  const CtrSchema& s = c.schema;
  if (s.table_rows.empty())
    throw UsageError("the synthetic CTR data has no tables: give schema.table_rows one row count per sparse feature");
  for (size_t t = 0; t < s.table_rows.size(); ++t)
    if (s.table_rows[t] < 1)
      throw UsageError("synthetic CTR table " + std::to_string(t) + " has " + std::to_string(s.table_rows[t]) +
                       " rows; every table needs at least 1");
  if (s.dense_features < 0) throw UsageError("synthetic CTR dense_features is negative; use 0 or more (Criteo: 13)");
  if (s.multi_hot < 1) throw UsageError("synthetic CTR multi_hot is " + std::to_string(s.multi_hot) + "; use 1 or more");
  if (!(c.click_rate > 0 && c.click_rate < 1))
    throw UsageError("synthetic CTR click_rate is " + std::to_string(c.click_rate) + "; it must lie in (0, 1)");
  if (!(c.signal >= 0) || !std::isfinite(c.signal))
    throw UsageError("synthetic CTR signal is " + std::to_string(c.signal) + "; use 0 (coin flips) or more");
  if (!(c.zipf_exponent >= 0) || !std::isfinite(c.zipf_exponent))
    throw UsageError("synthetic CTR zipf_exponent is " + std::to_string(c.zipf_exponent) +
                     "; use 0 (uniform ids) or more (1.05 is typical of click logs)");
}

double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x) / (1.0 + std::exp(x)); }

// One example as the generator sees it, before it goes into a batch.
struct Example {
  std::vector<int64_t> ids;  // tables x multi_hot
  std::vector<float> dense;
  double logit = 0;
};

class SyntheticCtr : public CtrSource {
 public:
  explicit SyntheticCtr(const SyntheticCtrConfig& config) : config_(config) {
    check_config(config_);
    const CtrSchema& s = config_.schema;
    for (size_t t = 0; t < s.table_rows.size(); ++t) {
      zipf_.emplace_back(s.table_rows[t], config_.zipf_exponent);
      scramble_.emplace_back(s.table_rows[t], mix(config_.seed, kScramble, t));
    }
    for (int64_t f = 0; f < s.dense_features; ++f)
      dense_weight_.push_back(weight(mix(config_.seed, kDenseWeight, static_cast<uint64_t>(f))));
    calibrate();
  }

  const CtrSchema& schema() const override { return config_.schema; }
  CtrBatch train_batch(int64_t first, int64_t count) override { return batch(kTrain, first, count); }
  CtrBatch val_batch(int64_t first, int64_t count) override { return batch(kHeldOut, first, count); }

  std::string describe() const override {
    const CtrSchema& s = config_.schema;
    const double rows = std::accumulate(s.table_rows.begin(), s.table_rows.end(), 0.0);
    char tail[160];
    std::snprintf(tail, sizeof tail, ", zipf %g, multi-hot %lld, %lld dense, signal %g, click rate %g, seed %llu",
                  config_.zipf_exponent, static_cast<long long>(s.multi_hot), static_cast<long long>(s.dense_features),
                  config_.signal, config_.click_rate, static_cast<unsigned long long>(config_.seed));
    return "synthetic: " + std::to_string(s.table_rows.size()) + " tables, " + compact_count(rows) + " rows" + tail;
  }

  std::vector<float> logits(bool held_out, int64_t first, int64_t count) const {
    check_range(first, count);
    std::vector<float> out(static_cast<size_t>(count));
    const uint64_t key = stream_key(held_out ? kHeldOut : kTrain);
    for (int64_t j = 0; j < count; ++j) out[j] = static_cast<float>(example(key, first + j).logit);
    return out;
  }

 private:
  static double weight(uint64_t h) { return kSqrt3 * (2.0 * uniform(h) - 1.0); }
  uint64_t stream_key(Stream s) const { return mix(config_.seed, s); }

  static void check_range(int64_t first, int64_t count) {
    if (first < 0 || count < 0)
      throw UsageError("synthetic CTR batch of " + std::to_string(count) + " examples from " + std::to_string(first) +
                       ": the first example and the count must not be negative");
  }

  // Counts of a heavy-tailed size (means from 1 to 128 by feature), stored as log(1 + count) like Criteo's.
  static float dense_value(uint64_t key, int64_t index, int64_t f) {
    const double scale = std::ldexp(1.0, static_cast<int>(f % 8));
    const double exponential = -std::log(uniform(mix(key, static_cast<uint64_t>(index), kDense, f)));
    return static_cast<float>(std::log1p(std::floor(scale * exponential)));
  }

  int64_t sparse_id(uint64_t key, int64_t index, size_t t, int64_t j) const {
    const uint64_t field = (static_cast<uint64_t>(t) << 32) | static_cast<uint64_t>(j);
    const int64_t rank = zipf_[t].sample(mix(key, static_cast<uint64_t>(index), kSparseId, field));
    return scramble_[t](rank - 1);
  }

  // The informative part of the logit, signal * (S + D) / sqrt(parts), without the bias.
  double planted(const Example& e) const {
    const CtrSchema& s = config_.schema;
    const size_t tables = s.table_rows.size(), m = static_cast<size_t>(s.multi_hot);
    double sparse = 0;
    for (size_t t = 0; t < tables; ++t)
      for (size_t j = 0; j < m; ++j) sparse += weight(mix(config_.seed, kRowWeight, t, e.ids[t * m + j]));
    sparse /= std::sqrt(static_cast<double>(tables * m));
    double dense = 0;
    for (size_t f = 0; f < e.dense.size(); ++f)
      dense += dense_weight_[f] * (e.dense[f] - dense_mean_[f]) / dense_sd_[f];
    const int parts = e.dense.empty() ? 1 : 2;
    if (!e.dense.empty()) dense /= std::sqrt(static_cast<double>(e.dense.size()));
    return config_.signal * (sparse + dense) / std::sqrt(static_cast<double>(parts));
  }

  Example draw(uint64_t key, int64_t index) const {
    const CtrSchema& s = config_.schema;
    Example e;
    e.ids.reserve(s.table_rows.size() * static_cast<size_t>(s.multi_hot));
    for (size_t t = 0; t < s.table_rows.size(); ++t)
      for (int64_t j = 0; j < s.multi_hot; ++j) e.ids.push_back(sparse_id(key, index, t, j));
    for (int64_t f = 0; f < s.dense_features; ++f) e.dense.push_back(dense_value(key, index, f));
    return e;
  }

  Example example(uint64_t key, int64_t index) const {
    Example e = draw(key, index);
    e.logit = planted(e) + bias_;
    return e;
  }

  // The dense moments (for centring the planted weights) and the bias that makes click_rate the mean click
  // probability, both from a sample of a stream of their own.
  void calibrate() {
    const uint64_t key = stream_key(kCalibration);
    std::vector<Example> sample;
    for (int64_t i = 0; i < kCalibrationExamples; ++i) sample.push_back(draw(key, i));
    const size_t features = static_cast<size_t>(config_.schema.dense_features);
    dense_mean_.assign(features, 0.0);
    dense_sd_.assign(features, 1.0);
    for (size_t f = 0; f < features; ++f) {
      double sum = 0, squares = 0;
      for (const Example& e : sample) sum += e.dense[f], squares += double(e.dense[f]) * e.dense[f];
      dense_mean_[f] = sum / kCalibrationExamples;
      const double variance = squares / kCalibrationExamples - dense_mean_[f] * dense_mean_[f];
      dense_sd_[f] = variance > 1e-12 ? std::sqrt(variance) : 1.0;
    }
    std::vector<double> z;
    for (const Example& e : sample) z.push_back(planted(e));
    bias_ = solve_bias(z, config_.click_rate);
  }

  // The b with mean(sigmoid(z + b)) = rate, by bisection (the mean rises monotonically with b).
  static double solve_bias(const std::vector<double>& z, double rate) {
    double low = -60, high = 60;
    for (int it = 0; it < 100; ++it) {
      const double mid = 0.5 * (low + high);
      double mean = 0;
      for (double v : z) mean += sigmoid(v + mid);
      (mean / static_cast<double>(z.size()) < rate ? low : high) = mid;
    }
    return 0.5 * (low + high);
  }

  CtrBatch batch(Stream s, int64_t first, int64_t count) const {
    check_range(first, count);
    const CtrSchema& sc = config_.schema;
    const size_t tables = sc.table_rows.size(), m = static_cast<size_t>(sc.multi_hot);
    CtrBatch b;
    b.size = count;
    b.dense.reserve(static_cast<size_t>(count * sc.dense_features));
    b.labels.reserve(static_cast<size_t>(count));
    b.ids.assign(tables, {});
    b.offsets.assign(tables, {0});
    const uint64_t key = stream_key(s);
    for (int64_t j = 0; j < count; ++j) {
      const int64_t index = first + j;
      const Example e = example(key, index);
      b.dense.insert(b.dense.end(), e.dense.begin(), e.dense.end());
      const bool click = uniform(mix(key, static_cast<uint64_t>(index), kLabel)) < sigmoid(e.logit);
      b.labels.push_back(click ? 1.0f : 0.0f);
      for (size_t t = 0; t < tables; ++t) {
        b.ids[t].insert(b.ids[t].end(), e.ids.begin() + t * m, e.ids.begin() + (t + 1) * m);
        b.offsets[t].push_back(static_cast<int64_t>(b.ids[t].size()));
      }
    }
    return b;
  }

  SyntheticCtrConfig config_;
  std::vector<ZipfRanks> zipf_;
  std::vector<RowScramble> scramble_;
  std::vector<double> dense_weight_, dense_mean_, dense_sd_;
  double bias_ = 0;
};

}  // namespace

std::unique_ptr<CtrSource> make_synthetic_ctr(const SyntheticCtrConfig& config) {
  return std::make_unique<SyntheticCtr>(config);
}

std::vector<float> synthetic_ctr_logits(const SyntheticCtrConfig& config, int64_t first, int64_t count,
                                        bool held_out) {
  return SyntheticCtr(config).logits(held_out, first, count);
}

}  // namespace crosstrain::data
