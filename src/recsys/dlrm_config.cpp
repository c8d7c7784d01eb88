#include "crosstrain/recsys/dlrm_config.h"

#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/named_enum.h"

namespace crosstrain::recsys {
namespace {

constexpr EnumName<DlrmMode> kPlacements[] = {{DlrmMode::Sharded, "sharded"},
                                                    {DlrmMode::ParameterServer, "ps"}};
constexpr EnumName<TableStorageKind> kStorages[] = {{TableStorageKind::Memory, "memory"},
                                                    {TableStorageKind::Mmap, "mmap"}};
constexpr EnumName<Pooling> kPoolings[] = {{Pooling::Sum, "sum"}, {Pooling::Mean, "mean"}};

// "64,32" -> {64, 32}; "26x1000" -> 26 times 1000. Every entry a positive integer.
std::vector<int64_t> parse_counts(const std::string& text, const std::string& key, bool allow_empty) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto x = item.find('x');
    try {
      size_t used = 0;
      if (x == std::string::npos) {
        const int64_t v = std::stoll(item, &used);
        if (used != item.size() || v < 1) throw std::invalid_argument(item);
        out.push_back(v);
      } else {
        const int64_t n = std::stoll(item.substr(0, x), &used);
        if (used != x || n < 1) throw std::invalid_argument(item);
        const std::string rest = item.substr(x + 1);
        const int64_t v = std::stoll(rest, &used);
        if (used != rest.size() || v < 1) throw std::invalid_argument(item);
        out.insert(out.end(), n, v);
      }
    } catch (const std::exception&) {
      throw UsageError(key + " = \"" + text + "\": '" + item +
                       "' is not a positive integer (write a comma list like \"1000,500\", or \"26x1000\")");
    }
  }
  if (out.empty() && !allow_empty) throw UsageError(key + " is empty: give at least one entry, e.g. \"1000\"");
  return out;
}

}  // namespace

DlrmMode parse_dlrm_mode(const std::string& name) {
  return parse_enum(kPlacements, name, "dlrm.mode", "sharded: all-to-all; ps: parameter server");
}
TableStorageKind parse_table_storage(const std::string& name) {
  return parse_enum(kStorages, name, "dlrm.ps_storage");
}
Pooling parse_pooling(const std::string& name) { return parse_enum(kPoolings, name, "dlrm.pooling"); }
const char* to_string(DlrmMode mode) { return enum_name(kPlacements, mode); }
const char* to_string(TableStorageKind kind) { return enum_name(kStorages, kind); }
const char* to_string(Pooling pooling) { return enum_name(kPoolings, pooling); }

std::vector<int64_t> DlrmConfig::table_rows() const { return parse_counts(tables, "dlrm.tables", false); }

std::vector<int64_t> DlrmConfig::bottom_widths() const {
  auto w = parse_counts(bottom_mlp, "dlrm.bottom_mlp", true);
  w.push_back(embedding_dim);
  return w;
}

std::vector<int64_t> DlrmConfig::top_widths() const {
  auto w = parse_counts(top_mlp, "dlrm.top_mlp", true);
  w.push_back(1);
  return w;
}

int64_t DlrmConfig::parameter_count() const {
  int64_t n = 0;
  for (int64_t rows : table_rows()) n += rows * embedding_dim;
  int64_t in = dense_features;
  for (int64_t w : bottom_widths()) n += (in + 1) * w, in = w;
  const int64_t features = static_cast<int64_t>(table_rows().size()) + 1;
  in = embedding_dim + features * (features - 1) / 2;
  for (int64_t w : top_widths()) n += (in + 1) * w, in = w;
  return n;
}

void check_dlrm(const DlrmConfig& c) {
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  c.table_rows();
  c.bottom_widths();
  c.top_widths();
  need(c.embedding_dim >= 1, "dlrm.embedding_dim must be at least 1");
  need(c.dense_features >= 1, "dlrm.dense_features must be at least 1");
  need(c.multi_hot >= 1, "dlrm.multi_hot must be at least 1 (ids per example and feature)");
  need(c.memory_budget_mb >= 0, "dlrm.memory_budget_mb must be 0 (unlimited) or more");
  need(c.sparse_lr > 0, "dlrm.sparse_lr must be positive");
  need(c.sparse_optimizer == "adagrad" || c.sparse_optimizer == "adam",
       "dlrm.sparse_optimizer = '" + c.sparse_optimizer + "': use adagrad (row-wise) or adam");
  need(c.zipf > 0, "dlrm.zipf must be positive (1.05 is typical of click logs)");
  need(c.signal >= 0, "dlrm.signal must be 0 (random labels) or more");
  need(c.click_rate > 0 && c.click_rate < 1, "dlrm.click_rate must be in (0, 1)");
  need(c.val_fraction > 0 && c.val_fraction < 1, "dlrm.val_fraction must be in (0, 1)");
  need(c.cache_rows >= 0, "dlrm.cache_rows must be 0 (no cache) or more");
  need(c.data == "synthetic" || c.table_rows().size() == 26,
       "dlrm.data names a Criteo file, which has 26 categorical features: dlrm.tables needs 26 entries (e.g. "
       "\"26x100000\"), it has " + std::to_string(c.table_rows().size()));
  need(c.data == "synthetic" || c.dense_features == 13, "dlrm.data names a Criteo file: dlrm.dense_features must be 13");
}

}  // namespace crosstrain::recsys
