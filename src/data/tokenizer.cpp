#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {

std::vector<uint16_t> ByteTokenizer::encode(const std::string& text) const {
  return std::vector<uint16_t>(reinterpret_cast<const unsigned char*>(text.data()),
                               reinterpret_cast<const unsigned char*>(text.data()) + text.size());
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& tokens) const {
  std::string out;
  out.reserve(tokens.size());
  for (int64_t t : tokens) {
    if (t >= 0 && t < kVocabSize) out.push_back(static_cast<char>(t));
    else out += "<" + std::to_string(t) + ">";
  }
  return out;
}

}  // namespace crosstrain::data
