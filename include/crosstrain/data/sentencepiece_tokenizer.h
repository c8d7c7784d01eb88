// SentencePiece (Debian's libsentencepiece): train a BPE or unigram model from text, encode and decode with it.
//
// Models trained here are set up to be lossless on any text, so that a token file decodes back to its corpus:
// no normalization (identity rule), whitespace kept as it is (no collapsing, no dummy prefix space), and byte
// fallback (ids 3..258 are the 256 bytes, used for characters the vocabulary lacks, e.g. '\n' and rare
// Unicode). Ids 0, 1, 2 are <unk>, <s>, </s>. libsentencepiece is opened at first use from a module built with
// crosstrain (libcrosstrain_sentencepiece.so; src/data/sentencepiece/module.cpp says why).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {

struct SentencePieceTraining {
  std::string type = "bpe";  // bpe or unigram
  int64_t vocab_size = 4096;
  int threads = 1;
  // sentencepiece skips longer lines when training (they are still encoded).
  int64_t max_sentence_bytes = 4192;
};

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Trains on the lines that `next_line` yields (it returns false at the end). Throws UsageError with
  // sentencepiece's reason when the vocabulary size does not suit the text (too small for its characters, or
  // more pieces than the text holds) or the type is unknown.
  static SentencePieceTokenizer train(const SentencePieceTraining& options,
                                      const std::function<bool(std::string&)>& next_line);
  // Reads a .model file. Throws UsageError naming the path when it is missing or not a SentencePiece model.
  static SentencePieceTokenizer load(const std::string& path);
  static SentencePieceTokenizer from_serialized(const std::string& model, const std::string& origin);

  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;
  ~SentencePieceTokenizer() override;

  // Line by line (sentencepiece's pieces never span lines anyway), so a long text never becomes one lattice.
  std::vector<uint32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override;
  std::string type() const override;
  // The model file's bytes (what tokenizer.model holds).
  const std::string& serialized() const;

 private:
  struct Impl;
  explicit SentencePieceTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crosstrain::data
