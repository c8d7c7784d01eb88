// SentencePiece through crosstrain's wrapper: train BPE and unigram on a small text made here, encode, decode.
#include <gtest/gtest.h>

#include <random>

#include "crosstrain/core/error.h"
#include "crosstrain/data/sentencepiece_tokenizer.h"

using namespace crosstrain;

namespace {

// About 60 KB of sentences over a small vocabulary, so pieces longer than a character are worth learning.
std::string sample_text() {
  const char* words[] = {"the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "training", "tokens",
                         "parallel", "pipeline", "gradient", "tensor", "model", "data", "and", "of", "is", "a"};
  std::mt19937 rng(1);
  std::string text;
  for (int line = 0; line < 1500; ++line) {
    const int n = 3 + static_cast<int>(rng() % 8);
    for (int w = 0; w < n; ++w) text += std::string(w ? " " : "") + words[rng() % std::size(words)];
    text += line % 7 == 0 ? "!\n" : ".\n";
  }
  return text;
}

data::SentencePieceTokenizer train(const std::string& text, const std::string& type, int64_t vocab) {
  data::SentencePieceTraining options;
  options.type = type;
  options.vocab_size = vocab;
  size_t pos = 0;
  return data::SentencePieceTokenizer::train(options, [&](std::string& line) {
    if (pos >= text.size()) return false;
    const size_t end = text.find('\n', pos);
    line = text.substr(pos, end - pos);
    pos = end + 1;
    return true;
  });
}

std::vector<int64_t> wide(const std::vector<uint32_t>& ids) { return {ids.begin(), ids.end()}; }

void expect_round_trip(const std::string& type, int64_t vocab) {
  const std::string text = sample_text();
  const auto t = train(text, type, vocab);
  EXPECT_EQ(t.vocab_size(), vocab);
  EXPECT_EQ(t.type(), "sentencepiece-" + type);
  const auto ids = t.encode(text);
  EXPECT_EQ(t.decode(wide(ids)), text);
  EXPECT_LT(ids.size(), text.size() / 3) << "learned pieces should cover words (bytes alone: one id per byte)";
  // Characters never seen in training, tabs, runs of spaces and newlines come back through byte fallback.
  const std::string unseen = "Zürich  日本\n\n\tqux  \n";
  EXPECT_EQ(t.decode(wide(t.encode(unseen))), unseen);
  // The serialized model reloads to the same ids.
  const auto again = data::SentencePieceTokenizer::from_serialized(t.serialized(), "test");
  EXPECT_EQ(again.encode(text), ids);
  EXPECT_EQ(t.decode({5, -1, 999999}).substr(1), "<-1><999999>");
}

std::string training_error(const std::string& type, int64_t vocab) {
  try {
    train(sample_text(), type, vocab);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

// Unigram keeps at most about 330 pieces of this text (it says so when asked for more).
TEST(SentencePiece, BpeRoundTrip) { expect_round_trip("bpe", 400); }
TEST(SentencePiece, UnigramRoundTrip) { expect_round_trip("unigram", 320); }

TEST(SentencePiece, VocabularyThatDoesNotSuitTheTextIsAUsageError) {
  EXPECT_NE(training_error("bpe", 100).find("too small"), std::string::npos);
  const std::string large = training_error("unigram", 50000);
  EXPECT_NE(large.find("cannot train a SentencePiece unigram model of 50000 pieces"), std::string::npos) << large;
  EXPECT_NE(training_error("wordpiece", 1000).find("not one of bpe, unigram"), std::string::npos);
}

TEST(SentencePiece, GarbageIsNotAModel) {
  try {
    data::SentencePieceTokenizer::from_serialized("not a model", "'x.model'");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'x.model' is not a SentencePiece model"), std::string::npos) << e.what();
  }
}
