// Token streams for language-model training, and batches cut from them.
//
// Sources: a plain text file (or a folder of them), tokenized by bytes; or a uint16 token file in nanoGPT's
// `.bin` layout (little-endian uint16, no header), mapped read-only. The stream is split into a training
// part and a validation part (the last `val_fraction` of the tokens).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace crosstrain::data {

// A read-only run of tokens; keeps its storage (vector or mapping) alive.
class TokenStream {
 public:
  TokenStream() = default;
  TokenStream(std::shared_ptr<const void> owner, const uint16_t* data, size_t size)
      : owner_(std::move(owner)), data_(data), size_(size) {}
  const uint16_t* data() const { return data_; }
  size_t size() const { return size_; }
  uint16_t operator[](size_t i) const { return data_[i]; }
  TokenStream slice(size_t begin, size_t end) const { return TokenStream(owner_, data_ + begin, end - begin); }
  uint16_t max_token() const;

 private:
  std::shared_ptr<const void> owner_;
  const uint16_t* data_ = nullptr;
  size_t size_ = 0;
};

struct DatasetConfig {
  std::string path;             // text file, folder of text files, or .bin token file
  std::string format = "auto";  // auto (by extension: .bin is tokens), text, bin
  double val_fraction = 0.1;
};

struct Splits {
  TokenStream train, val;
  std::string description;  // "2.4 MB of text from 42 files" etc.
  std::string warning;      // non-empty when the source is suspect (text that looks binary)
};

// Checks what can be checked without reading the data: data.path is set and names a regular file or folder,
// data.format is known, and text fits in memory. Throws UsageError naming data.path.
void check_source(const DatasetConfig& config);

// Loads and splits. Throws UsageError with the path on a missing, empty or malformed file.
Splits load_dataset(const DatasetConfig& config, int64_t block_size);

// Sequences starting at `offsets`: inputs [n, T] and next-token targets [n, T], int64.
void make_batch(const TokenStream& stream, const std::vector<int64_t>& offsets, int64_t block_size,
                at::Tensor& inputs, at::Tensor& targets);

}  // namespace crosstrain::data
