// Token files and the meta.json that describes them.
//
// A token file is nanoGPT's `.bin` layout: token ids one after another, little-endian, no header; uint16 (ids up
// to 65535, nanoGPT's own) or uint32 (larger vocabularies). The width is not in the file: meta.json beside it
// says it ("dtype"), with the vocabulary size and the tokenizer that wrote it; `crosstrain tokenize` writes both.
// Without meta.json a .bin is uint16, or uint32 when data.format = "bin32" (docs/tokenization.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace crosstrain::data {

struct TokenMeta {
  int64_t vocab_size = 0;
  std::string dtype = "uint16";    // uint16 or uint32
  std::string tokenizer;           // file beside meta.json ("tokenizer.model"); "" for none
  std::string tokenizer_type;      // Tokenizer::type()
  std::string train = "train.bin"; // the token files, beside meta.json
  std::string val;                 // "" when the text was not split: the trainer splits train by data.val_fraction
  uint64_t tokens = 0;             // in train and val together
  uint64_t bytes = 0;              // of text they encode
  std::string corpus;              // where the text came from
};

// uint16 when every id of the vocabulary fits, else uint32.
std::string dtype_for_vocab(int64_t vocab_size);
int bytes_per_token(const std::string& dtype);  // 2 or 4; throws UsageError for another dtype

// meta.json in `folder`, or nothing when there is none or it does not describe token files (no "dtype").
// Throws UsageError naming the file when it is not JSON or its fields have the wrong types or values.
std::optional<TokenMeta> read_token_meta(const std::string& folder);
std::string token_meta_json(const TokenMeta& meta);

// The tokens as `dtype`, little-endian. Throws UsageError when an id does not fit the type.
std::string token_file_bytes(const std::vector<uint32_t>& tokens, const std::string& dtype);

// Writes `bytes` to `path` through a temporary file in the same folder, renamed at the end, so a reader never
// sees half a file. Throws Error naming the path on failure (and leaves no temporary behind).
void write_file_atomically(const std::string& path, const std::string& bytes);

}  // namespace crosstrain::data
