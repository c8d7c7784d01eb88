// Tokenizers: text <-> token ids.
//
// ByteTokenizer: every byte is a token (vocabulary 256); lossless for any text and needs no file.
// Subword tokenizers behind the Tokenizer interface (docs/tokenization.md):
//   SentencePieceTokenizer (sentencepiece_tokenizer.h): a SentencePiece .model, BPE or unigram, trained here;
//   BpeTokenizer (bpe_tokenizer.h): byte-level BPE read from Hugging Face's tokenizer.json or vocab.json +
//   merges.txt (GPT-2, Llama 3).
// load_tokenizer opens either from a path.
#pragma once

#include <cstdint>
#include <memory>
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

// A subword tokenizer. encode and decode are const and safe to call from several threads at once.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Ids of `text`; decode(encode(text)) == text for any UTF-8 text (both kinds fall back to bytes).
  virtual std::vector<uint32_t> encode(const std::string& text) const = 0;
  // Ids the tokenizer does not know are shown as <id>.
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  // One more than the largest id: what model.vocab_size must be at least.
  virtual int64_t vocab_size() const = 0;
  // "sentencepiece-bpe", "sentencepiece-unigram" or "byte-level-bpe".
  virtual std::string type() const = 0;
};

// Opens a tokenizer by its path: a SentencePiece model (*.model), a Hugging Face tokenizer.json (*.json other
// than vocab.json), vocab.json (merges.txt beside it), or a folder holding tokenizer.model, tokenizer.json, or
// vocab.json + merges.txt. Throws UsageError naming the path when it is none of these or cannot be read.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path);

}  // namespace crosstrain::data
