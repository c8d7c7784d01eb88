#include "crosstrain/data/dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/machine.h"
#include "crosstrain/data/corpus.h"
#include "crosstrain/data/sft.h"
#include "crosstrain/data/token_file.h"
#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {
namespace fs = std::filesystem;

TokenStream TokenStream::slice(size_t begin, size_t end) const {
  TokenStream s = *this;
  s.data_ = static_cast<const char*>(data_) + begin * static_cast<size_t>(width_);
  s.size_ = end - begin;
  return s;
}

uint32_t TokenStream::max_token() const {
  if (size_ == 0) return 0;
  if (width_ == 2) return *std::max_element(data16(), data16() + size_);
  return *std::max_element(data32(), data32() + size_);
}

namespace {

std::vector<fs::path> text_files(const fs::path& path) {
  std::vector<fs::path> files;
  for (const auto& f : corpus_files(path.string())) files.emplace_back(f);
  return files;
}

std::string gib(uint64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(bytes) / (1ULL << 30) << " GiB";
  return out.str();
}

// Counts bytes that text does not contain: control characters other than whitespace, and bytes outside a
// valid UTF-8 sequence. Fed in pieces, so a sequence may straddle two reads.
class TextCensus {
 public:
  void add(const unsigned char* p, size_t n) {
    bytes_ += n;
    for (size_t i = 0; i < n; ++i) {
      const unsigned char b = p[i];
      if (pending_ > 0) {
        if ((b & 0xC0) == 0x80) {
          --pending_;
          continue;
        }
        pending_ = 0;
        ++odd_;  // the lead byte whose sequence broke off
      }
      if (b < 0x80) odd_ += (b < 0x20 && (b < 0x09 || b > 0x0D)) || b == 0x7F;
      else if (b >= 0xC2 && b <= 0xDF) pending_ = 1;
      else if (b >= 0xE0 && b <= 0xEF) pending_ = 2;
      else if (b >= 0xF0 && b <= 0xF4) pending_ = 3;
      else ++odd_;
    }
  }
  double odd_fraction() const { return bytes_ ? static_cast<double>(odd_) / static_cast<double>(bytes_) : 0; }

 private:
  uint64_t bytes_ = 0, odd_ = 0;
  int pending_ = 0;
};

// Reads the file in pieces straight into tokens: no copy of the whole text is ever held as a string.
void append_tokens(const fs::path& path, std::vector<uint16_t>& tokens, TextCensus& census) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read data file '" + path.string() + "': " + std::strerror(errno));
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    const auto n = static_cast<size_t>(in.gcount());
    const auto* bytes = reinterpret_cast<const unsigned char*>(buffer.data());
    tokens.insert(tokens.end(), bytes, bytes + n);
    census.add(bytes, n);
  }
  if (in.bad()) throw UsageError("cannot read data file '" + path.string() + "': " + std::strerror(errno));
}

TokenStream load_text(const fs::path& path, std::string& description, std::string& warning) {
  const std::vector<fs::path> files = text_files(path);
  uint64_t total = 0;
  for (const auto& f : files) total += fs::file_size(f);
  auto tokens = std::make_shared<std::vector<uint16_t>>();
  tokens->reserve(total);
  TextCensus census;
  for (const auto& f : files) append_tokens(f, *tokens, census);
  description = std::to_string(tokens->size()) + " bytes of text from " + std::to_string(files.size()) +
                (files.size() == 1 ? " file" : " files");
  // Every byte becomes a token whatever it is, so binary data trains without complaint: say so.
  if (census.odd_fraction() > 0.25)
    warning = "data '" + path.string() + "' does not look like text: " +
              std::to_string(static_cast<int>(100 * census.odd_fraction())) +
              "% of its bytes are control characters or not UTF-8, and each byte becomes a token; if it holds "
              "tokens, name it *.bin or set data.format = \"bin\" (uint16) or \"bin32\" (uint32)";
  return TokenStream(tokens, tokens->data(), tokens->size());
}

// Maps a token file of `width` bytes per token (2 or 4).
TokenStream load_bin(const fs::path& path, int width, std::string& description) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UsageError("cannot open token file '" + path.string() + "': " + std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  const size_t bytes = static_cast<size_t>(st.st_size);
  const std::string type = width == 2 ? "uint16" : "uint32";
  if (bytes % static_cast<size_t>(width) != 0) {
    close(fd);
    throw UsageError("token file '" + path.string() + "' has " + std::to_string(bytes) + " bytes, not a whole "
                     "number of " + type + " tokens; is it really a nanoGPT .bin file of that type (data.format, "
                     "meta.json's dtype)?");
  }
  if (bytes == 0) {
    close(fd);
    throw UsageError("token file '" + path.string() + "' is empty");
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) throw UsageError("cannot map token file '" + path.string() + "': " + std::strerror(errno));
  std::shared_ptr<const void> owner(map, [bytes](const void* p) { munmap(const_cast<void*>(p), bytes); });
  const size_t n = bytes / static_cast<size_t>(width);
  description = std::to_string(n) + " " + type + " tokens from " + path.filename().string();
  if (width == 2) return TokenStream(owner, static_cast<const uint16_t*>(map), n);
  return TokenStream(owner, static_cast<const uint32_t*>(map), n);
}

// The token width of a .bin: meta.json's dtype when it has one (it must agree with data.format = "bin32"), else
// uint32 for bin32 and uint16 for bin.
int token_width(const std::string& format, const std::optional<TokenMeta>& meta, const std::string& path) {
  if (!meta) return format == "bin32" ? 4 : 2;
  if (format == "bin32" && meta->dtype != "uint32")
    throw UsageError("data.format is \"bin32\" but the meta.json beside '" + path + "' says dtype \"" + meta->dtype +
                     "\"; set data.format = \"bin\" (meta.json decides) or fix meta.json");
  return bytes_per_token(meta->dtype);
}

}  // namespace

namespace {

std::string resolved_format(const DatasetConfig& config) {
  const fs::path extension = fs::path(config.path).extension();
  if (config.format == "auto") return extension == ".bin" ? "bin" : extension == ".jsonl" ? "jsonl" : "text";
  if (config.format != "text" && config.format != "bin" && config.format != "bin32" && config.format != "jsonl")
    throw UsageError("data.format '" + config.format + "' is not one of auto, text, bin (uint16, or as meta.json "
                     "says), bin32 (uint32), jsonl (prompt/response pairs)");
  return config.format;
}

}  // namespace

void check_source(const DatasetConfig& config) {
  const fs::path path(config.path);
  if (config.path.empty()) throw UsageError("data.path is not set; point it at a text file, a folder or a .bin file");
  std::error_code ec;
  const auto status = fs::status(path, ec);
  if (!fs::exists(status) && resolved_format(config) != "text")
    throw UsageError("token file '" + config.path + "' does not exist (data.path); write it with crosstrain tokenize "
                     "CORPUS --out FOLDER (docs/tokenization.md)");
  if (!fs::exists(status))
    throw UsageError("data file '" + config.path + "' does not exist (data.path); for the demo corpus run "
                     "scripts/install-deps.sh, which installs Debian's fortunes package");
  // A device, pipe or socket has no end to read to (/dev/zero) or cannot be read twice by several ranks.
  if (!fs::is_regular_file(status) && !fs::is_directory(status))
    throw UsageError("data.path '" + config.path + "' is not a regular file or a folder; point it at a text file, "
                     "a folder of them or a .bin token file");
  if (resolved_format(config) != "text") return;  // token files are mapped, not read into memory
  uint64_t total = 0;
  for (const auto& f : text_files(path)) total += fs::file_size(f, ec);
  // Text is held as one uint16 token per byte in every rank.
  const uint64_t need = 2 * total;
  const int64_t available = available_memory_bytes();  // -1: unknown, and then not checked
  if (available >= 0 && need > static_cast<uint64_t>(available))
    throw UsageError("data.path '" + config.path + "' holds " + gib(total) + " of text, which needs " + gib(need) +
                     " of memory per rank as byte tokens, but " + gib(available) + " are available; use a part of "
                     "it, or convert it to a .bin token file (crosstrain tokenize), which is mapped instead of read");
}

namespace {

// A token file and its validation part: a second file when meta.json names one for this file, else the tail.
void load_tokens(const DatasetConfig& config, const std::string& format, Splits& s) {
  const fs::path path(config.path);
  const auto meta = read_token_meta(path.parent_path().string());
  const int width = token_width(format, meta, config.path);
  const TokenStream all = load_bin(path, width, s.description);
  if (meta) {
    s.vocab_size = meta->vocab_size;
    if (!meta->tokenizer.empty()) s.tokenizer = (path.parent_path() / meta->tokenizer).string();
  }
  if (meta && !meta->val.empty() && path.filename() == meta->train) {
    std::string val_description;
    s.train = all;
    s.val = load_bin(path.parent_path() / meta->val, width, val_description);
    s.description += " (validation: " + val_description + ")";
    return;
  }
  const size_t val = static_cast<size_t>(static_cast<double>(all.size()) * config.val_fraction);
  s.train = all.slice(0, all.size() - val);
  s.val = all.slice(all.size() - val, all.size());
}

}  // namespace

Splits load_dataset(const DatasetConfig& config, int64_t block_size) {
  check_source(config);
  if (config.val_fraction < 0 || config.val_fraction >= 1)
    throw UsageError("data.val_fraction must be in [0, 1), got " + std::to_string(config.val_fraction));
  Splits s;
  const std::string format = resolved_format(config);
  if (format == "jsonl") {
    load_jsonl(config, block_size, s);
  } else if (format == "text") {
    const TokenStream all = load_text(fs::path(config.path), s.description, s.warning);
    const size_t val = static_cast<size_t>(static_cast<double>(all.size()) * config.val_fraction);
    s.train = all.slice(0, all.size() - val);
    s.val = all.slice(all.size() - val, all.size());
  } else {
    load_tokens(config, format, s);
  }
  const size_t need = static_cast<size_t>(block_size) + 1;
  if (s.train.size() < need || (s.val.size() > 0 && s.val.size() < need) ||
      (config.val_fraction > 0 && s.val.size() < need))
    throw UsageError("data '" + config.path + "' (" + s.description + ") is too small for sequences of " +
                     std::to_string(block_size) + " tokens in both the training and validation parts");
  return s;
}

std::unique_ptr<Tokenizer> data_tokenizer(const DatasetConfig& config) {
  try {
    if (config.path.empty() || resolved_format(config) == "text") return nullptr;
    if (resolved_format(config) == "jsonl")
      return config.tokenizer.empty() ? nullptr : load_tokenizer(config.tokenizer);
    const fs::path folder = fs::path(config.path).parent_path();
    const auto meta = read_token_meta(folder.string());
    if (!meta || meta->tokenizer.empty()) return nullptr;
    return load_tokenizer((folder / meta->tokenizer).string());
  } catch (const UsageError&) {
    return nullptr;  // a sample shown as <id>s is better than a finished run that fails at its last line
  }
}

void check_vocab(const Splits& s, int64_t model_vocab_size, const std::string& path) {
  if (s.vocab_size > model_vocab_size)
    throw UsageError("data '" + path + "' was tokenized with a vocabulary of " + std::to_string(s.vocab_size) +
                     " tokens (its meta.json) but model.vocab_size is " + std::to_string(model_vocab_size) +
                     "; set model.vocab_size = " + std::to_string(s.vocab_size) +
                     " (rounded up to a multiple of parallel.tp)");
  const uint32_t top = std::max(s.train.max_token(), s.val.max_token());
  if (static_cast<int64_t>(top) >= model_vocab_size)
    throw UsageError("data '" + path + "' holds token " + std::to_string(top) + " but model.vocab_size is " +
                     std::to_string(model_vocab_size) + "; set model.vocab_size to at least " +
                     std::to_string(int64_t{top} + 1) + ", or check data.format and meta.json's dtype");
}

namespace {

template <typename T>
void copy_sequences(const T* tokens, const std::vector<int64_t>& offsets, int64_t block_size, int64_t* x, int64_t* y) {
  for (size_t i = 0; i < offsets.size(); ++i) {
    const T* src = tokens + offsets[i];
    int64_t* xi = x + static_cast<int64_t>(i) * block_size;
    int64_t* yi = y + static_cast<int64_t>(i) * block_size;
    for (int64_t t = 0; t < block_size; ++t) {
      xi[t] = src[t];
      yi[t] = src[t + 1];
    }
  }
}

}  // namespace

void make_batch(const TokenStream& stream, const std::vector<int64_t>& offsets, int64_t block_size,
                at::Tensor& inputs, at::Tensor& targets) {
  const auto n = static_cast<int64_t>(offsets.size());
  inputs = at::empty({n, block_size}, at::kLong);
  targets = at::empty({n, block_size}, at::kLong);
  int64_t* x = inputs.data_ptr<int64_t>();
  int64_t* y = targets.data_ptr<int64_t>();
  // One branch per batch, not per token: each width gets its own tight loop.
  if (stream.bytes_per_token() == 2) copy_sequences(stream.data16(), offsets, block_size, x, y);
  else copy_sequences(stream.data32(), offsets, block_size, x, y);
}

}  // namespace crosstrain::data
