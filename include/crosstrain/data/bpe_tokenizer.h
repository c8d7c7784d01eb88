// Byte-level BPE as GPT-2 and Llama 3 use it, read from Hugging Face files so that pretrained vocabularies work:
// tokenizer.json (model.vocab and model.merges, merges as "a b" strings or as ["a", "b"] pairs; added_tokens are
// known for decoding) or vocab.json + merges.txt.
//
// Encoding: the text is cut into pre-tokens by GPT-2's pattern (pretokenize below); each pre-token's bytes become
// symbols through GPT-2's byte-to-unicode table (bytes_to_unicode), and the adjacent pair whose merge has the
// lowest rank (its line in the merges list) is merged, everywhere in the pre-token, until no pair has a merge.
// Bytes no merge reaches stay single-byte tokens. Special tokens (<|endoftext|>) are not recognised in text.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {

// GPT-2's table from a byte to the Unicode character (as UTF-8) that stands for it in vocabularies: printable
// Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the other 68 bytes for U+0100 onwards in
// byte order (so ' ' is 'Ġ', U+0120, and '\n' is 'Ċ', U+010A).
const std::array<std::string, 256>& bytes_to_unicode();

// GPT-2's pre-tokenizer, the pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// followed exactly for ASCII: letters A-Z a-z, digits 0-9, whitespace space \t \n \v \f \r. Every non-ASCII
// UTF-8 code point (and every byte that is not valid UTF-8) counts as a letter: right for the letters of other
// scripts, while non-ASCII digits, punctuation and spaces (U+00A0, '…', '€') join a neighbouring word where
// GPT-2 would cut. The pieces concatenate to the text.
std::vector<std::string> pretokenize(const std::string& text);

class BpeTokenizer : public Tokenizer {
 public:
  // vocab: token string (in byte-to-unicode characters) -> id; merges in rank order. `added`: special tokens,
  // decoded as their text. Throws UsageError (naming `origin`) when a merge names a token not in the vocabulary.
  BpeTokenizer(std::unordered_map<std::string, uint32_t> vocab,
               const std::vector<std::pair<std::string, std::string>>& merges,
               const std::unordered_map<std::string, uint32_t>& added, const std::string& origin);

  // Throws UsageError naming the file when it is missing, not JSON, or has no model.vocab / model.merges.
  static BpeTokenizer from_tokenizer_json(const std::string& path);
  static BpeTokenizer from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt);

  std::vector<uint32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::string type() const override { return "byte-level-bpe"; }

 private:
  void encode_piece(const std::string& piece, std::vector<uint32_t>& out) const;

  static constexpr uint32_t kNone = UINT32_MAX;
  std::array<uint32_t, 256> byte_ids_{};                    // id of each single byte's token, kNone when absent
  std::unordered_map<uint64_t, std::pair<uint32_t, uint32_t>> merges_;  // (left, right) -> (rank, merged id)
  std::vector<std::string> pieces_;                         // id -> the bytes it stands for
  int64_t vocab_size_ = 0;
  std::string origin_;
};

}  // namespace crosstrain::data
