// Token streams for language-model training, and batches cut from them.
//
// Sources: a plain text file (or a folder of them), tokenized by bytes; or a token file in nanoGPT's `.bin`
// layout (little-endian, no header), uint16 or uint32 as the meta.json beside it says (token_file.h), mapped
// read-only. The stream is split into a training part and a validation part (the last `val_fraction` of the
// tokens), unless meta.json names a separate validation file.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/data/loss_mask.h"

namespace crosstrain::data {

class Tokenizer;  // tokenizer.h

// A read-only run of uint16 or uint32 tokens; keeps its storage (vector or mapping) alive.
class TokenStream {
 public:
  TokenStream() = default;
  TokenStream(std::shared_ptr<const void> owner, const uint16_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size), width_(2) {}
  TokenStream(std::shared_ptr<const void> owner, const uint32_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size), width_(4) {}
  size_t size() const { return size_; }
  int bytes_per_token() const { return width_; }
  const uint16_t* data16() const { return width_ == 2 ? static_cast<const uint16_t*>(data_) : nullptr; }
  const uint32_t* data32() const { return width_ == 4 ? static_cast<const uint32_t*>(data_) : nullptr; }
  uint32_t operator[](size_t i) const { return width_ == 2 ? data16()[i] : data32()[i]; }
  TokenStream slice(size_t begin, size_t end) const;
  uint32_t max_token() const;

 private:
  std::shared_ptr<const void> owner_;
  const void* data_ = nullptr;
  size_t size_ = 0;
  int width_ = 2;
};

struct DatasetConfig {
  std::string path;             // text file, folder of text files, or .bin token file
  // auto (by extension: .bin is tokens, .jsonl prompt/response pairs), text, bin (uint16 unless meta.json says
  // uint32), bin32 (uint32), jsonl (sft.h)
  std::string format = "auto";
  double val_fraction = 0.1;
  std::string tokenizer;   // jsonl: the tokenizer (load_tokenizer's path); "": bytes
  int64_t eos_token = -1;  // jsonl: the end-of-text id after each response; -1: byte 0 (bytes only)
};

// The [data] keys as a recipe names them, each with its field, in the order config.toml lists them: the config
// reader (train/config.cpp) visits them with `key(name, field, help)` (and `key(name, field, parse, to_string, help)`
// for a name parsed into an enum; the help is the line `crosstrain config` and docs/config-reference.md show),
// so a new key of this section is one line here.
template <typename Key>
void visit_keys(DatasetConfig& c, Key&& key) {
  key("path", c.path, "text file, folder of text files, .bin token file or .jsonl prompt/response pairs");
  key("format", c.format, "auto (by extension), text, bin (uint16 unless meta.json says uint32), bin32 or jsonl");
  key("val_fraction", c.val_fraction, "share of the data held out for validation, in [0, 1)");
  key("tokenizer", c.tokenizer,
      "jsonl: the tokenizer (tokenizer.json, vocab+merges or SentencePiece model); \"\": bytes");
  key("eos_token", c.eos_token, "jsonl: the end-of-text id after each response; -1: byte 0 (bytes only)");
}

struct Splits {
  TokenStream train, val;
  std::string description;  // "2.4 MB of text from 42 files" etc.
  std::string warning;      // non-empty when the source is suspect (text that looks binary)
  int64_t vocab_size = 0;   // from meta.json beside a token file; 0: unknown
  std::string tokenizer;    // the tokenizer meta.json names, as a path; "": bytes (text) or unknown
  LossMask train_mask, val_mask;  // jsonl: which targets are trained; empty: all
};

// Checks what can be checked without reading the data: data.path is set and names a regular file or folder,
// data.format is known, and text fits in memory. Throws UsageError naming data.path.
void check_source(const DatasetConfig& config);

// Loads and splits. Throws UsageError with the path on a missing, empty or malformed file.
Splits load_dataset(const DatasetConfig& config, int64_t block_size);

// The tokenizer that wrote the data (the one meta.json beside a token file names; data.tokenizer for JSONL),
// for decoding what a model trained on it generates; null for text (bytes are the tokens) or when there is none
// or it cannot be read.
std::unique_ptr<Tokenizer> data_tokenizer(const DatasetConfig& config);

// Throws UsageError when the data needs a larger model.vocab_size: a token id in either part is not below it, or
// meta.json says the tokenizer's vocabulary is larger.
void check_vocab(const Splits& splits, int64_t model_vocab_size, const std::string& path);

// Sequences starting at `offsets`: inputs [n, T] and next-token targets [n, T], int64.
void make_batch(const TokenStream& stream, const std::vector<int64_t>& offsets, int64_t block_size,
                at::Tensor& inputs, at::Tensor& targets);

}  // namespace crosstrain::data
