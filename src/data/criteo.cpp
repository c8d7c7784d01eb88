// The Criteo click log (Kaggle display advertising / Terabyte day_N files): one example per line,
//   label \t I1 .. I13 \t C1 .. C26
// with integer counts I, categorical values C as 8-digit hex strings, and empty fields where a value is missing.
//
// The file is memory-mapped read-only and its line starts are indexed once (8 bytes per line: 366 MB for the
// 45.8M lines of the Kaggle set, instead of the 11 GB its lines would take as strings); a batch parses only the
// lines it asks for, so every rank can read any slice of the same global batch.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/data/ctr.h"
#include "ctr_random.h"

namespace crosstrain::data {

namespace {

constexpr int64_t kDenseFields = 13, kCategoricalFields = 26, kFields = 1 + kDenseFields + kCategoricalFields;
constexpr const char* kLineFormat =
    "a Criteo line is a 0/1 label, 13 integer features and 26 categorical features (hex strings), tab separated, "
    "with empty fields where a value is missing";

int64_t hash_bytes(std::string_view field, int64_t rows, uint64_t seed) {
  const uint64_t h = ctr_random::mix(seed, ctr_random::fnv1a(field.data(), field.size()));
  return static_cast<int64_t>(h % static_cast<uint64_t>(rows));
}

// A read-only memory map of a whole file, unmapped when destroyed.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) {
    const int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) throw UsageError("cannot open Criteo file '" + path + "': " + std::strerror(errno) + "; check data.path");
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      throw UsageError("Criteo file '" + path + "' is not a regular file; point data.path at a train.txt or day_N file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) {
      close(fd);
      throw UsageError("Criteo file '" + path + "' is empty; it needs one example per line (" + kLineFormat + ")");
    }
    void* map = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    close(fd);  // the mapping keeps the file open
    if (map == MAP_FAILED)
      throw UsageError("cannot map Criteo file '" + path + "': " + std::strerror(map_errno));
    data_ = static_cast<const char*>(map);
  }
  ~MappedFile() { munmap(const_cast<char*>(data_), size_); }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return data_; }
  size_t size() const { return size_; }
  void advise(int advice) const { madvise(const_cast<char*>(data_), size_, advice); }

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The byte offset of every line's start, in one pass over the mapping (memchr for each newline).
std::vector<int64_t> index_lines(const MappedFile& file) {
  std::vector<int64_t> starts;
  file.advise(MADV_SEQUENTIAL);
  const char* begin = file.data();
  const char* end = begin + file.size();
  for (const char* p = begin; p < end;) {
    starts.push_back(p - begin);
    const void* newline = std::memchr(p, '\n', static_cast<size_t>(end - p));
    p = newline ? static_cast<const char*>(newline) + 1 : end;
  }
  file.advise(MADV_RANDOM);  // batches read scattered lines from now on
  return starts;
}

std::string field_name(int64_t field) {
  if (field == 0) return "label";
  if (field <= kDenseFields) return "I" + std::to_string(field);
  return "C" + std::to_string(field - kDenseFields);
}

void check_schema(const CriteoConfig& c) {
  const CtrSchema& s = c.schema;
  if (static_cast<int64_t>(s.table_rows.size()) != kCategoricalFields)
    throw UsageError("a Criteo schema needs 26 table sizes (one per categorical feature C1..C26), not " +
                     std::to_string(s.table_rows.size()) + "; give table_rows 26 entries");
  for (size_t t = 0; t < s.table_rows.size(); ++t)
    if (s.table_rows[t] < 1)
      throw UsageError("Criteo table " + std::to_string(t) + " (C" + std::to_string(t + 1) + ") has " +
                       std::to_string(s.table_rows[t]) + " rows; every table needs at least 1");
  if (s.dense_features != kDenseFields)
    throw UsageError("a Criteo schema has 13 dense features (I1..I13), not " + std::to_string(s.dense_features));
  if (s.multi_hot != 1)
    throw UsageError("Criteo examples have one id per categorical feature; set multi_hot = 1, not " +
                     std::to_string(s.multi_hot));
  if (!(c.val_fraction >= 0 && c.val_fraction < 1))
    throw UsageError("Criteo val_fraction is " + std::to_string(c.val_fraction) + "; it must lie in [0, 1)");
}

class CriteoSource : public CtrSource {
 public:
  explicit CriteoSource(const CriteoConfig& config) : config_((check_schema(config), config)), file_(config.path) {
    starts_ = index_lines(file_);
    const int64_t lines = static_cast<int64_t>(starts_.size());
    val_lines_ = std::min<int64_t>(lines - 1, std::llround(static_cast<double>(lines) * config_.val_fraction));
    train_lines_ = lines - val_lines_;
  }

  const CtrSchema& schema() const override { return config_.schema; }

  CtrBatch train_batch(int64_t first, int64_t count) override { return batch(0, train_lines_, first, count, "train"); }

  CtrBatch val_batch(int64_t first, int64_t count) override {
    if (val_lines_ == 0 && count > 0)
      throw UsageError("Criteo file '" + config_.path + "' has no held-out lines: " +
                       std::to_string(starts_.size()) + " lines with val_fraction " +
                       std::to_string(config_.val_fraction) + "; raise val_fraction or use a larger file");
    return batch(train_lines_, val_lines_, first, count, "held-out");
  }

  std::string describe() const override {
    double rows = 0;
    for (int64_t r : config_.schema.table_rows) rows += static_cast<double>(r);
    return "criteo: '" + config_.path + "', " + std::to_string(starts_.size()) + " lines (" +
           std::to_string(train_lines_) + " train, " + std::to_string(val_lines_) + " held out), 26 tables, " +
           std::to_string(static_cast<int64_t>(rows)) + " rows, hash seed " + std::to_string(config_.hash_seed);
  }

 private:
  // Lines base + (first + j) mod lines for j < count: the stream wraps around its part of the file.
  CtrBatch batch(int64_t base, int64_t lines, int64_t first, int64_t count, const char* stream) const {
    if (first < 0 || count < 0)
      throw UsageError(std::string("Criteo ") + stream + " batch of " + std::to_string(count) + " examples from " +
                       std::to_string(first) + ": the first example and the count must not be negative");
    CtrBatch b;
    b.size = count;
    b.dense.reserve(static_cast<size_t>(count * kDenseFields));
    b.labels.reserve(static_cast<size_t>(count));
    b.ids.assign(kCategoricalFields, {});
    b.offsets.assign(kCategoricalFields, {0});
    for (int64_t j = 0; j < count; ++j) parse_line(base + (first + j) % lines, b);
    return b;
  }

  std::string_view line_text(int64_t line) const {
    const int64_t begin = starts_[line];
    int64_t end = line + 1 < static_cast<int64_t>(starts_.size()) ? starts_[line + 1] - 1
                                                                  : static_cast<int64_t>(file_.size());
    if (end > begin && file_.data()[end - 1] == '\n') --end;  // the last line's own newline
    if (end > begin && file_.data()[end - 1] == '\r') --end;  // a file written with CRLF line ends
    return std::string_view(file_.data() + begin, static_cast<size_t>(end - begin));
  }

  [[noreturn]] void fail(int64_t line, int64_t field, std::string_view value, const std::string& what) const {
    std::string shown(value.substr(0, 40));
    if (value.size() > 40) shown += "...";
    throw UsageError("Criteo file '" + config_.path + "', line " + std::to_string(line + 1) + ", field " +
                     field_name(field) + ": \"" + shown + "\" " + what + "; " + kLineFormat);
  }

  // A count as log(1 + max(x, 0)): Criteo has a few negative values (-1, -2 in I2), clamped like the reference
  // DLRM preprocessing does; missing is 0.
  float dense_value(int64_t line, int64_t field, std::string_view text) const {
    size_t i = 0;
    const bool negative = !text.empty() && text[0] == '-';
    if (negative) i = 1;
    if (i == text.size() && negative) fail(line, field, text, "is not an integer");
    double value = 0;
    for (; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9') fail(line, field, text, "is not an integer");
      value = value * 10 + (text[i] - '0');
    }
    return negative ? 0.0f : static_cast<float>(std::log1p(value));
  }

  void parse_line(int64_t line, CtrBatch& b) const {
    const std::string_view text = line_text(line);
    std::string_view fields[kFields];
    int64_t n = 0;
    for (size_t start = 0;; ++n) {
      const size_t tab = text.find('\t', start);
      if (n < kFields) fields[n] = text.substr(start, tab == std::string_view::npos ? tab : tab - start);
      if (tab == std::string_view::npos) break;
      start = tab + 1;
    }
    if (++n != kFields)
      throw UsageError("Criteo file '" + config_.path + "', line " + std::to_string(line + 1) + ": " +
                       std::to_string(n) + " tab-separated fields instead of 40 (" +
                       (n < kFields ? "field " + field_name(n) + " and after are missing" : "too many") + "); " +
                       kLineFormat + " (a missing value keeps its tab)");
    if (fields[0] != "0" && fields[0] != "1") fail(line, 0, fields[0], "is not a 0/1 label");
    b.labels.push_back(fields[0] == "1" ? 1.0f : 0.0f);
    for (int64_t f = 1; f <= kDenseFields; ++f) b.dense.push_back(dense_value(line, f, fields[f]));
    for (int64_t t = 0; t < kCategoricalFields; ++t) {
      const std::string_view value = fields[1 + kDenseFields + t];
      b.ids[t].push_back(hash_bytes(value, config_.schema.table_rows[t], config_.hash_seed));
      b.offsets[t].push_back(static_cast<int64_t>(b.ids[t].size()));
    }
  }

  CriteoConfig config_;
  MappedFile file_;
  std::vector<int64_t> starts_;
  int64_t train_lines_ = 0, val_lines_ = 0;
};

}  // namespace

int64_t hash_category(const std::string& field, int64_t rows, uint64_t seed) {
  if (rows < 1) throw UsageError("hash_category: a table of " + std::to_string(rows) + " rows; it needs at least 1");
  return hash_bytes(field, rows, seed);
}

std::unique_ptr<CtrSource> open_criteo(const CriteoConfig& config) { return std::make_unique<CriteoSource>(config); }

}  // namespace crosstrain::data
