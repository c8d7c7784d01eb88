#include "crosstrain/data/tokenizer.h"

#include <filesystem>

#include "crosstrain/core/error.h"
#include "crosstrain/data/bpe_tokenizer.h"
#include "crosstrain/data/sentencepiece_tokenizer.h"

namespace crosstrain::data {
namespace fs = std::filesystem;

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

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  const fs::path p(path);
  std::error_code ec;
  if (!fs::exists(p, ec)) throw UsageError("tokenizer '" + path + "' does not exist");
  if (fs::is_directory(p, ec)) {
    for (const char* name : {"tokenizer.model", "tokenizer.json", "vocab.json"})
      if (fs::exists(p / name, ec)) return load_tokenizer((p / name).string());
    throw UsageError("folder '" + path + "' holds no tokenizer.model, tokenizer.json or vocab.json + merges.txt");
  }
  if (p.extension() == ".model") return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(path));
  if (p.filename() == "vocab.json") {
    const fs::path merges = p.parent_path() / "merges.txt";
    if (!fs::exists(merges, ec))
      throw UsageError("tokenizer '" + path + "' needs merges.txt beside it, and '" + merges.string() + "' is missing");
    return std::make_unique<BpeTokenizer>(BpeTokenizer::from_vocab_merges(path, merges.string()));
  }
  if (p.extension() == ".json") return std::make_unique<BpeTokenizer>(BpeTokenizer::from_tokenizer_json(path));
  throw UsageError("tokenizer '" + path + "' is not a SentencePiece .model, a tokenizer.json, vocab.json (with "
                   "merges.txt) or a folder holding one");
}

}  // namespace crosstrain::data
