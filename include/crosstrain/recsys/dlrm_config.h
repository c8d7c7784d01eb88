// The [dlrm] section: a DLRM-style click-through-rate model (model.arch = "dlrm"), its data, and how its
// embedding tables are sharded (docs/recsys.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::recsys {

// dlrm.mode, where the tables live: every rank holds its shards and lookups and gradients move by all-to-all
// ("sharded"), or row blocks on every rank's parameter server with workers that pull rows, cache hot ones and
// push gradients ("ps"; the dense part through sync.mode = ssp or async).
enum class DlrmMode { Sharded, ParameterServer };
// dlrm.ps_storage, where a server's rows live: anonymous memory ("memory") or memory-mapped files under
// run.dir/tables ("mmap": the kernel pages cold rows out).
enum class TableStorageKind { Memory, Mmap };
// dlrm.pooling: how an example's ids of one feature combine.
enum class Pooling { Sum, Mean };

DlrmMode parse_dlrm_mode(const std::string& name);
TableStorageKind parse_table_storage(const std::string& name);
Pooling parse_pooling(const std::string& name);
const char* to_string(DlrmMode mode);
const char* to_string(TableStorageKind kind);
const char* to_string(Pooling pooling);

struct DlrmConfig {
  // Rows of each embedding table (one per sparse feature), e.g. "100000,20000,5000"; "26x1000" repeats.
  std::string tables = "8x1000";
  int64_t embedding_dim = 16;
  int64_t dense_features = 13;
  int64_t multi_hot = 1;             // ids per example per sparse feature (synthetic data)
  Pooling pooling = Pooling::Sum;
  std::string bottom_mlp = "64";     // hidden widths of the dense MLP; its output is embedding_dim wide
  std::string top_mlp = "64,32";     // hidden widths of the top MLP; a 1-wide logit follows
  // Per table: auto, table, row or column, one for all or a comma list (recsys/sharding_plan.h).
  std::string sharding = "auto";
  int64_t memory_budget_mb = 0;      // per rank, for tables (weights + optimizer state); 0: unlimited
  std::string sparse_optimizer = "adagrad";  // adagrad (row-wise) or adam
  double sparse_lr = 0.05;
  // Data: "synthetic", or the path of a Criteo TSV file (label, 13 integer, 26 categorical features).
  std::string data = "synthetic";
  double zipf = 1.05;                // synthetic: exponent of the id distribution
  double signal = 1.0;               // synthetic: strength of the planted click signal
  double click_rate = 0.25;          // synthetic: roughly the positive fraction
  double val_fraction = 0.1;         // Criteo: the last fraction of the lines is held out
  DlrmMode mode = DlrmMode::Sharded;
  TableStorageKind ps_storage = TableStorageKind::Memory;
  int64_t cache_rows = 0;             // ps: rows each worker caches (0: no cache)

  bool on_parameter_server() const { return mode == DlrmMode::ParameterServer; }
  // Parsed forms.
  std::vector<int64_t> table_rows() const;
  std::vector<int64_t> bottom_widths() const;  // hidden widths, then embedding_dim
  std::vector<int64_t> top_widths() const;     // hidden widths, then 1
  int64_t parameter_count() const;             // tables + MLPs
};

// The [dlrm] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(DlrmConfig& c, Key&& key) {
  key("tables", c.tables, "rows of each embedding table, e.g. \"100000,20000\" or \"26x1000\"");
  key("embedding_dim", c.embedding_dim, "width of every embedding (and of the bottom MLP's output)");
  key("dense_features", c.dense_features, "continuous inputs per example");
  key("multi_hot", c.multi_hot, "ids per example and sparse feature (synthetic data)");
  key("pooling", c.pooling, parse_pooling, to_string, "how a feature's ids combine: sum or mean");
  key("bottom_mlp", c.bottom_mlp, "hidden widths of the dense MLP, e.g. \"64\"");
  key("top_mlp", c.top_mlp, "hidden widths of the top MLP before its 1-wide logit, e.g. \"64,32\"");
  key("sharding", c.sharding, "per table: auto, table, row or column (one for all, or a comma list)");
  key("memory_budget_mb", c.memory_budget_mb, "per rank, for tables and their optimizer state; 0: unlimited");
  key("sparse_optimizer", c.sparse_optimizer, "tables' optimizer: adagrad (row-wise) or adam");
  key("sparse_lr", c.sparse_lr, "tables' learning rate");
  key("data", c.data, "\"synthetic\", or the path of a Criteo TSV file");
  key("zipf", c.zipf, "synthetic: exponent of the id distribution");
  key("signal", c.signal, "synthetic: strength of the planted click signal");
  key("click_rate", c.click_rate, "synthetic: roughly the share of positive labels");
  key("val_fraction", c.val_fraction, "Criteo: the last share of the lines held out for validation");
  key("mode", c.mode, parse_dlrm_mode, to_string,
      "sharded (tables split over the ranks, in lockstep) or ps (a parameter server; workers drift)");
  key("ps_storage", c.ps_storage, parse_table_storage, to_string,
      "ps: the server's tables in memory, or in a memory-mapped file (mmap)");
  key("cache_rows", c.cache_rows, "ps: rows each worker caches; 0: no cache");
}

// Checks that need no world size; UsageError names the key (dlrm.tables etc.) and the fix.
void check_dlrm(const DlrmConfig& c);

}  // namespace crosstrain::recsys
