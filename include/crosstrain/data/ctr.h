// Click-through-rate data for recommendation models (DLRM): examples with dense (integer) features, sparse
// (categorical) features and a 0/1 label.
//
// Two sources, both addressed by the index of an example so that every layout reads the same global batch:
// - the Criteo TSV format (label, 13 integer features, 26 categorical features as hex strings, tab separated;
//   empty fields are missing), with categorical values hashed into each table's rows;
// - a deterministic synthetic generator: Zipf-distributed ids (a few hot rows, a long tail, as real click logs
//   have) and a planted signal (a hidden weight per row and per dense feature decides the click probability),
//   so tests and benchmarks need no download and a model can learn something measurable.
// No libtorch here (tests run it without); the trainer turns batches into tensors.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crosstrain::data {

struct CtrSchema {
  int64_t dense_features = 13;
  std::vector<int64_t> table_rows;  // one embedding table per sparse feature: its number of rows
  int64_t multi_hot = 1;            // ids per example per sparse feature (synthetic; Criteo has 1)
};

// A batch of `size` examples. Sparse feature t of example i is ids[t][offsets[t][i] .. offsets[t][i+1]),
// every id in [0, table_rows[t]).
struct CtrBatch {
  int64_t size = 0;
  std::vector<float> dense;                  // size x dense_features, row-major, already log(1 + max(x, 0))
  std::vector<float> labels;                 // size, 0 or 1
  std::vector<std::vector<int64_t>> ids;     // per table
  std::vector<std::vector<int64_t>> offsets; // per table, size + 1
};

class CtrSource {
 public:
  virtual ~CtrSource() = default;
  virtual const CtrSchema& schema() const = 0;
  // Examples first, first + 1, ..., first + count - 1 of the endless training stream (a finite file wraps).
  virtual CtrBatch train_batch(int64_t first, int64_t count) = 0;
  // The same for the held-out stream (a synthetic generator's other examples; a file's last val_fraction).
  virtual CtrBatch val_batch(int64_t first, int64_t count) = 0;
  virtual std::string describe() const = 0;  // one line: "synthetic: 8 tables, 1.2M rows, zipf 1.05"
};

struct SyntheticCtrConfig {
  CtrSchema schema;
  uint64_t seed = 1;
  double zipf_exponent = 1.05;   // s of P(rank k) ~ 1 / k^s; hot rows are spread over the table by a hash
  double signal = 1.0;           // scale of the planted logit (0: labels are coin flips)
  double click_rate = 0.25;      // roughly the fraction of positive labels (sets the planted bias)
};

// Example i is a pure function of (config, i): any rank can make any slice, in any order.
// Throws UsageError for a config it cannot follow (no tables, a table of 0 rows, click_rate outside (0, 1), ...).
std::unique_ptr<CtrSource> make_synthetic_ctr(const SyntheticCtrConfig& config);

// The planted logit of synthetic examples first .. first + count - 1 (of the held-out stream when `held_out`): the
// score of a model that learned the task perfectly, whose AUC is the best attainable one (tests check the signal is
// learnable with it; a report can set a trained model's AUC beside it).
std::vector<float> synthetic_ctr_logits(const SyntheticCtrConfig& config, int64_t first, int64_t count,
                                        bool held_out);

struct CriteoConfig {
  std::string path;              // a Criteo TSV file (train.txt / day_N layout)
  CtrSchema schema;              // table_rows: 26 entries (each categorical feature hashed into its table)
  double val_fraction = 0.1;     // the last fraction of the lines is the held-out stream
  uint64_t hash_seed = 0;
};

// Indexes the line starts once (a streaming pass; the file is memory-mapped read-only, not loaded), then
// parses the examples asked for. Throws UsageError naming the file, line and field for a malformed line.
std::unique_ptr<CtrSource> open_criteo(const CriteoConfig& config);

// The category of a Criteo categorical field ("" when missing) as a row of a table with `rows` rows.
int64_t hash_category(const std::string& field, int64_t rows, uint64_t seed);

}  // namespace crosstrain::data
