// The CTR data sources: the synthetic generator (determinism, Zipf ids, click rate, a learnable planted signal)
// and the Criteo TSV reader (parsing, missing values, hashing, wrap-around, the held-out split, errors).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/data/ctr.h"
#include "crosstrain/recsys/metrics.h"
#include "ctr_random.h"
#include "scratch.h"

using namespace crosstrain::data;
namespace fs = std::filesystem;

namespace {

SyntheticCtrConfig synthetic(std::vector<int64_t> rows, int64_t multi_hot = 1) {
  SyntheticCtrConfig c;
  c.schema.table_rows = std::move(rows);
  c.schema.multi_hot = multi_hot;
  return c;
}

// Example j of a batch as one comparable record: label, dense values, ids of every table.
std::vector<double> example(const CtrBatch& b, const CtrSchema& s, int64_t j) {
  std::vector<double> out = {b.labels[j]};
  for (int64_t f = 0; f < s.dense_features; ++f) out.push_back(b.dense[j * s.dense_features + f]);
  for (size_t t = 0; t < b.ids.size(); ++t)
    for (int64_t k = b.offsets[t][j]; k < b.offsets[t][j + 1]; ++k) out.push_back(static_cast<double>(b.ids[t][k]));
  return out;
}

double mean(const std::vector<float>& v) {
  double sum = 0;
  for (float x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// sum_{k=1..n} k^-s
double harmonic(int64_t n, double s) {
  double h = 0;
  for (int64_t k = 1; k <= n; ++k) h += std::pow(static_cast<double>(k), -s);
  return h;
}

}  // namespace

TEST(CtrRandom, RowScrambleIsAPermutation) {
  for (int64_t n : {1, 2, 3, 1000, 1024, 1025, 4097}) {
    const ctr_random::RowScramble scramble(n, 42);
    std::vector<int> hits(static_cast<size_t>(n), 0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = scramble(i);
      ASSERT_GE(row, 0);
      ASSERT_LT(row, n);
      ++hits[row];
    }
    EXPECT_EQ(std::count(hits.begin(), hits.end(), 1), n) << n << " rows";
  }
  const ctr_random::RowScramble other(1000, 43);
  EXPECT_NE(other(0), ctr_random::RowScramble(1000, 42)(0));  // keyed: tables differ
}

TEST(CtrRandom, ZipfRanksStayInRangeAtEveryExponent) {
  for (double s : {0.0, 0.5, 1.0, 1.05, 2.0, 4.0})
    for (int64_t n : {1, 2, 10, 1000000000}) {
      const ctr_random::ZipfRanks zipf(n, s);
      int64_t ones = 0;
      for (uint64_t key = 0; key < 2000; ++key) {
        const int64_t k = zipf.sample(ctr_random::splitmix64(key));
        ASSERT_TRUE(k >= 1 && k <= n) << k << " of " << n << " at s " << s;
        ones += k == 1;
      }
      if (n == 2 && s == 1.0) {
        EXPECT_NEAR(ones / 2000.0, 2.0 / 3.0, 0.04);  // P(1) = 1 / (1 + 1/2)
      }
    }
}

TEST(SyntheticCtr, AnExampleIsTheSameWhicheverSliceMakesIt) {
  const SyntheticCtrConfig c = synthetic({1000, 50, 100000}, 2);
  auto source = make_synthetic_ctr(c);
  const CtrBatch whole = source->train_batch(0, 10);
  const CtrBatch part = source->train_batch(3, 3);
  ASSERT_EQ(part.size, 3);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(example(part, c.schema, j), example(whole, c.schema, 3 + j));
  // Another generator with the same config, asked in another order, agrees; another seed does not.
  auto again = make_synthetic_ctr(c);
  (void)again->val_batch(100, 7);
  EXPECT_EQ(example(again->train_batch(5, 1), c.schema, 0), example(whole, c.schema, 5));
  SyntheticCtrConfig other = c;
  other.seed = 2;
  EXPECT_NE(example(make_synthetic_ctr(other)->train_batch(5, 1), c.schema, 0), example(whole, c.schema, 5));
}

TEST(SyntheticCtr, BatchesHaveTheSchemasShapeAndRange) {
  const SyntheticCtrConfig c = synthetic({7, 1, 1000000000}, 3);
  auto source = make_synthetic_ctr(c);
  const CtrBatch b = source->train_batch(1000, 64);
  ASSERT_EQ(b.dense.size(), 64u * 13);
  ASSERT_EQ(b.labels.size(), 64u);
  ASSERT_EQ(b.ids.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    ASSERT_EQ(b.offsets[t].size(), 65u);
    for (int64_t j = 0; j <= 64; ++j) EXPECT_EQ(b.offsets[t][j], 3 * j);
    for (int64_t id : b.ids[t]) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, c.schema.table_rows[t]);
    }
  }
  for (float x : b.dense) EXPECT_TRUE(std::isfinite(x) && x >= 0) << x;
  for (float y : b.labels) EXPECT_TRUE(y == 0.0f || y == 1.0f);
  EXPECT_EQ(source->train_batch(5, 0).size, 0);
  EXPECT_NE(source->describe().find("3 tables"), std::string::npos) << source->describe();
}

TEST(SyntheticCtr, IdsFollowZipfAndHotRowsAreSpreadOverTheTable) {
  const int64_t rows = 1000, n = 40000;
  SyntheticCtrConfig c = synthetic({rows});
  const CtrBatch b = make_synthetic_ctr(c)->train_batch(0, n);
  std::vector<int64_t> count(rows, 0);
  for (int64_t id : b.ids[0]) ++count[id];
  std::vector<int64_t> by_count(rows);
  for (int64_t r = 0; r < rows; ++r) by_count[r] = r;
  std::sort(by_count.begin(), by_count.end(), [&](int64_t a, int64_t b) { return count[a] > count[b]; });
  // The hottest row against P(rank 1) = 1 / H(n, s): about 0.136 for 1000 rows at s = 1.05.
  const double p1 = 1.0 / harmonic(rows, c.zipf_exponent);
  EXPECT_NEAR(static_cast<double>(count[by_count[0]]) / n, p1, 0.1 * p1);
  // The top 1% of rows take their theoretical share (about 39%), far above the 1% of uniform ids.
  int64_t top = 0;
  for (int k = 0; k < rows / 100; ++k) top += count[by_count[k]];
  const double top_share = harmonic(rows / 100, c.zipf_exponent) / harmonic(rows, c.zipf_exponent);
  EXPECT_NEAR(static_cast<double>(top) / n, top_share, 0.05 * top_share);
  // The ten hottest rows are scattered, not rows 0..9.
  const auto [low, high] = std::minmax_element(by_count.begin(), by_count.begin() + 10);
  EXPECT_GT(*high - *low, rows / 4);
  // With no skew, no row is much hotter than n / rows.
  c.zipf_exponent = 0;
  const CtrBatch flat = make_synthetic_ctr(c)->train_batch(0, n);
  std::fill(count.begin(), count.end(), 0);
  for (int64_t id : flat.ids[0]) ++count[id];
  EXPECT_LT(*std::max_element(count.begin(), count.end()), 3 * n / rows);
}

TEST(SyntheticCtr, ABillionRowTableIsSampledWithoutATable) {
  // Rejection-inversion needs no cumulative table: 1e9 rows cost what 1e3 do, and the head is as hot as theory.
  const int64_t n = 20000;
  auto source = make_synthetic_ctr(synthetic({1000000000}));
  const CtrBatch b = source->train_batch(0, n);
  std::map<int64_t, int64_t> count;
  for (int64_t id : b.ids[0]) ++count[id];
  int64_t hottest = 0;
  for (const auto& [id, c] : count) hottest = std::max(hottest, c);
  // P(rank 1) for 1e9 rows at s = 1.05 is about 1 / 13.5 (the partial zeta sum, by its integral).
  const double p1 = 1.0 / (1.0 + (std::pow(1e9 + 0.5, -0.05) - std::pow(1.5, -0.05)) / -0.05);
  EXPECT_NEAR(static_cast<double>(hottest) / n, p1, 0.15 * p1);
}

TEST(SyntheticCtr, PositiveRateFollowsClickRate) {
  for (double rate : {0.25, 0.05}) {
    SyntheticCtrConfig c = synthetic({1000, 100000, 20, 5000});
    c.click_rate = rate;
    const CtrBatch b = make_synthetic_ctr(c)->train_batch(0, 20000);
    EXPECT_NEAR(mean(b.labels), rate, 0.15 * rate) << "click_rate " << rate;
  }
}

TEST(SyntheticCtr, ThePlantedSignalIsLearnable) {
  const int64_t n = 20000;
  for (double signal : {1.0, 2.0}) {
    SyntheticCtrConfig c = synthetic({1000, 100000, 20, 5000, 300, 1000000});
    c.signal = signal;
    auto source = make_synthetic_ctr(c);
    const std::vector<float> labels = source->train_batch(0, n).labels;
    const double auc = crosstrain::recsys::roc_auc(synthetic_ctr_logits(c, 0, n, false), labels);
    EXPECT_GT(auc, signal == 1.0 ? 0.68 : 0.78) << "signal " << signal;
    // The held-out stream is the same task: its own planted logits rank its own labels as well.
    const std::vector<float> val_labels = source->val_batch(0, n).labels;
    EXPECT_NEAR(crosstrain::recsys::roc_auc(synthetic_ctr_logits(c, 0, n, true), val_labels), auc, 0.03);
    // ... and the training stream's logits are no score for the held-out labels.
    EXPECT_NEAR(crosstrain::recsys::roc_auc(synthetic_ctr_logits(c, 0, n, false), val_labels), 0.5, 0.03);
  }
  SyntheticCtrConfig coin = synthetic({1000, 5000});
  coin.signal = 0;
  const CtrBatch b = make_synthetic_ctr(coin)->train_batch(0, n);
  const std::vector<float> logits = synthetic_ctr_logits(coin, 0, n, false);
  EXPECT_EQ(*std::min_element(logits.begin(), logits.end()), *std::max_element(logits.begin(), logits.end()));
  EXPECT_NEAR(mean(b.labels), coin.click_rate, 0.02);
}

TEST(SyntheticCtr, TrainAndHeldOutStreamsAreDisjoint) {
  const SyntheticCtrConfig c = synthetic({100000, 100000, 1000000});
  auto source = make_synthetic_ctr(c);
  const int64_t n = 3000;
  const CtrBatch train = source->train_batch(0, n), val = source->val_batch(0, n);
  std::set<std::vector<double>> seen;
  for (int64_t j = 0; j < n; ++j) seen.insert(example(train, c.schema, j));
  int64_t shared = 0;
  for (int64_t j = 0; j < n; ++j) shared += seen.count(example(val, c.schema, j));
  EXPECT_EQ(shared, 0);
}

TEST(SyntheticCtr, RefusesConfigsItCannotFollow) {
  EXPECT_THROW(make_synthetic_ctr(synthetic({})), crosstrain::UsageError);
  EXPECT_THROW(make_synthetic_ctr(synthetic({10, 0})), crosstrain::UsageError);
  SyntheticCtrConfig c = synthetic({10});
  c.click_rate = 1.5;
  EXPECT_THROW(make_synthetic_ctr(c), crosstrain::UsageError);
  EXPECT_THROW(make_synthetic_ctr(synthetic({10}))->train_batch(-1, 4), crosstrain::UsageError);
}

namespace {

// A fresh folder under the system's temporary directory, removed with the test.
class CriteoFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = crosstrain::testing::scratch_dir(std::string("criteo-") +
                                            ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& text) {
    const std::string path = (dir_ / "day_0.tsv").string();
    std::ofstream(path, std::ios::binary) << text;
    return path;
  }

  CriteoConfig config(const std::string& path, double val_fraction = 0.2) {
    CriteoConfig c;
    c.path = path;
    c.schema.table_rows.assign(26, 0);
    for (int t = 0; t < 26; ++t) c.schema.table_rows[t] = 10 + 7 * t;
    c.val_fraction = val_fraction;
    c.hash_seed = 5;
    return c;
  }

  std::string usage_error(const CriteoConfig& c) {
    try {
      open_criteo(c)->train_batch(0, 100);
    } catch (const crosstrain::UsageError& e) {
      return e.what();
    }
    return "(no error)";
  }

  fs::path dir_;
};

// Line i: label i % 2, I_f = i * f (I2 = -1 on odd lines, I5 missing), C_t = hex of i * 1000 + t (C7 missing).
std::string line(int i) {
  std::string out = std::to_string(i % 2);
  for (int f = 1; f <= 13; ++f) {
    out += '\t';
    if (f == 5) continue;
    out += f == 2 && i % 2 ? "-1" : std::to_string(i * f);
  }
  for (int t = 1; t <= 26; ++t) {
    out += '\t';
    if (t == 7) continue;
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", i * 1000 + t);
    out += hex;
  }
  return out;
}

std::string lines(int n) {
  std::string text;
  for (int i = 0; i < n; ++i) text += line(i) + "\n";
  return text;
}

}  // namespace

TEST_F(CriteoFile, ParsesValuesMissingFieldsAndHashes) {
  const CriteoConfig c = config(write(lines(10)));
  auto source = open_criteo(c);
  const CtrBatch b = source->train_batch(0, 8);
  ASSERT_EQ(b.size, 8);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(b.labels[i], static_cast<float>(i % 2));
    for (int f = 1; f <= 13; ++f) {
      const double raw = f == 5 || (f == 2 && i % 2) ? 0 : i * f;  // missing and negative are 0
      EXPECT_FLOAT_EQ(b.dense[i * 13 + f - 1], static_cast<float>(std::log1p(raw))) << "line " << i << " I" << f;
    }
    for (int t = 0; t < 26; ++t) {
      char hex[16];
      std::snprintf(hex, sizeof hex, "%08x", i * 1000 + t + 1);
      const std::string field = t == 6 ? "" : hex;
      EXPECT_EQ(b.ids[t][i], hash_category(field, c.schema.table_rows[t], c.hash_seed)) << "line " << i << " C" << t + 1;
      EXPECT_EQ(b.offsets[t][i + 1], i + 1);
    }
  }
}

TEST_F(CriteoFile, TrainingWrapsAndTheLastLinesAreHeldOut) {
  // 10 lines, the last 20% held out: training is lines 0..7 and wraps; held out is 8, 9.
  auto source = open_criteo(config(write(lines(10))));
  const CtrBatch train = source->train_batch(6, 5);  // lines 6, 7, 0, 1, 2
  const CtrBatch first = source->train_batch(0, 3);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(train.dense[(2 + j) * 13], first.dense[j * 13]);
  EXPECT_FLOAT_EQ(train.dense[0], std::log1p(6.0f));  // I1 of line 6
  EXPECT_FLOAT_EQ(train.dense[13], std::log1p(7.0f));
  const CtrBatch val = source->val_batch(0, 3);  // lines 8, 9, 8
  EXPECT_FLOAT_EQ(val.dense[0], std::log1p(8.0f));
  EXPECT_FLOAT_EQ(val.dense[13], std::log1p(9.0f));
  EXPECT_FLOAT_EQ(val.dense[26], std::log1p(8.0f));
  EXPECT_NE(source->describe().find("8 train, 2 held out"), std::string::npos) << source->describe();
}

TEST_F(CriteoFile, ALastLineWithoutNewlineAndCrlfLineEndsRead) {
  std::string text = line(0) + "\r\n" + line(1) + "\r\n" + line(2);
  auto source = open_criteo(config(write(text), 0.0));
  const CtrBatch b = source->train_batch(0, 4);  // 3 lines, wrapping to line 0
  EXPECT_FLOAT_EQ(b.dense[2 * 13 + 12], std::log1p(26.0f));  // I13 of line 2, with no \r or \n after it
  EXPECT_EQ(b.ids[25][3], b.ids[25][0]);
  EXPECT_EQ(b.ids[25][0], hash_category("0000001a", 10 + 7 * 25, 5));  // C26 of line 0, no \r
  EXPECT_THROW(source->val_batch(0, 1), crosstrain::UsageError);  // val_fraction 0: nothing held out
}

TEST_F(CriteoFile, MalformedLinesNameTheFileLineAndField) {
  std::string text = lines(3);
  std::string bad = line(3);
  bad.replace(bad.find('\t', bad.find('\t', bad.find('\t') + 1) + 1) + 1, 1, "x");  // I3 starts with x
  text += bad + "\n";
  const CriteoConfig c = config(write(text), 0.0);
  std::string message = usage_error(c);
  EXPECT_NE(message.find(c.path), std::string::npos) << message;
  EXPECT_NE(message.find("line 4, field I3"), std::string::npos) << message;
  EXPECT_NE(message.find("not an integer"), std::string::npos) << message;

  std::string short_line = line(1);
  short_line.erase(short_line.rfind('\t'));  // 39 fields
  message = usage_error(config(write(lines(1) + short_line + "\n"), 0.0));
  EXPECT_NE(message.find("line 2: 39 tab-separated fields instead of 40"), std::string::npos) << message;
  EXPECT_NE(message.find("C26"), std::string::npos) << message;

  message = usage_error(config(write("2" + line(0).substr(1) + "\n"), 0.0));
  EXPECT_NE(message.find("line 1, field label"), std::string::npos) << message;
}

TEST_F(CriteoFile, RefusesEmptyFilesMissingFilesAndWrongSchemas) {
  EXPECT_NE(usage_error(config(write(""))).find("is empty"), std::string::npos);
  EXPECT_NE(usage_error(config((dir_ / "absent.tsv").string())).find("cannot open"), std::string::npos);
  CriteoConfig c = config(write(lines(4)));
  c.schema.table_rows.pop_back();
  EXPECT_NE(usage_error(c).find("26 table sizes"), std::string::npos) << usage_error(c);
  c = config(write(lines(4)));
  c.schema.dense_features = 12;
  EXPECT_NE(usage_error(c).find("13 dense features"), std::string::npos) << usage_error(c);
}

TEST(HashCategory, StableInRangeAndSpread) {
  // Pinned (computed once): a checkpoint of hashed tables is only valid while each category keeps its row, so a
  // change of the hash must be deliberate (and break this line), never a side effect.
  EXPECT_EQ(hash_category("68fd1e64", 1000003, 0), 496572);
  EXPECT_EQ(hash_category("", 1000003, 0), 583185);
  EXPECT_NE(hash_category("68fd1e64", 1000003, 0), hash_category("68fd1e64", 1000003, 1));
  std::vector<int64_t> buckets(10, 0);
  for (int i = 0; i < 10000; ++i) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", i);
    const int64_t row = hash_category(hex, 10, 0);
    ASSERT_GE(row, 0);
    ASSERT_LT(row, 10);
    ++buckets[row];
  }
  for (int64_t b : buckets) EXPECT_NEAR(b, 1000, 150);
  EXPECT_THROW(hash_category("x", 0, 0), crosstrain::UsageError);
}
