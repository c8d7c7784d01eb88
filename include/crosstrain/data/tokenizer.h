// Byte-level tokenizer: every byte is a token (vocabulary 256). Lossless for any text and any language.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::data {

class ByteTokenizer {
 public:
  static constexpr int64_t kVocabSize = 256;
  std::vector<uint16_t> encode(const std::string& text) const;
  // Tokens outside 0..255 (from a file tokenized otherwise) are shown as <id>.
  std::string decode(const std::vector<int64_t>& tokens) const;
};

}  // namespace crosstrain::data
