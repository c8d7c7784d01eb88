// Byte-level BPE against ids worked out by hand from a small vocabulary and merges list written here.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "crosstrain/core/error.h"
#include "crosstrain/data/bpe_tokenizer.h"
#include "scratch.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

// Ids by hand. "Ġ" is ' ', "Ċ" is '\n', and é's bytes C3 A9 are "Ã" "©" in GPT-2's byte-to-unicode table.
const char* kVocab = R"({"a": 0, "b": 1, "c": 2, "Ġ": 3, "d": 4, "ab": 5, "bc": 6, "abc": 7, "Ġa": 8, "Ġab": 9,
                         "Ċ": 10, "Ã": 11, "©": 12, "Ã©": 13, "'": 14, "s": 15})";
// Rank order matters: "b c" (rank 0) comes before "a b" (rank 1), so "abc" is a + bc -> abc, never ab + c.
const char* kMerges[][2] = {{"b", "c"}, {"a", "b"}, {"a", "bc"}, {"Ġ", "a"}, {"Ġ", "ab"}, {"Ã", "©"}};

// Under the test's own name: ctest runs each test in its own process, several at once.
fs::path temp_dir(const std::string& name) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return crosstrain::testing::scratch_dir("bpe-" + test + "-" + name);
}

fs::path write_tokenizer_json(const std::string& name, bool merges_as_pairs) {
  const fs::path path = temp_dir(name) / "tokenizer.json";
  std::ofstream out(path);
  out << R"({"version": "1.0", "added_tokens": [{"id": 16, "content": "<|endoftext|>", "special": true}],)"
      << R"("model": {"type": "BPE", "vocab": )" << kVocab << R"(, "merges": [)";
  for (size_t i = 0; i < std::size(kMerges); ++i) {
    if (i) out << ", ";
    if (merges_as_pairs) out << "[\"" << kMerges[i][0] << "\", \"" << kMerges[i][1] << "\"]";
    else out << "\"" << kMerges[i][0] << " " << kMerges[i][1] << "\"";
  }
  out << "]}}";
  return path;
}

data::BpeTokenizer vocab_merges_tokenizer() {
  const fs::path dir = temp_dir("bpe_vocab_merges");
  std::ofstream(dir / "vocab.json") << kVocab;
  std::ofstream merges(dir / "merges.txt");
  merges << "#version: 0.2\n";
  for (const auto& m : kMerges) merges << m[0] << " " << m[1] << "\n";
  merges.close();
  return data::BpeTokenizer::from_vocab_merges((dir / "vocab.json").string(), (dir / "merges.txt").string());
}

std::vector<uint32_t> ids(std::initializer_list<uint32_t> list) { return list; }

void expect_fixed_ids(const data::Tokenizer& t, int64_t vocab_size = 17) {
  EXPECT_EQ(t.encode("abc"), ids({7}));        // b c first, then a bc (order matters)
  EXPECT_EQ(t.encode("ab"), ids({5}));
  EXPECT_EQ(t.encode(" ab"), ids({9}));        // Ġ a b: a b (rank 1) before Ġ a (rank 3), then Ġ ab
  EXPECT_EQ(t.encode(" abc"), ids({3, 7}));    // bc, then a bc; "Ġ abc" is no merge
  EXPECT_EQ(t.encode(" a"), ids({8}));
  EXPECT_EQ(t.encode("abc abd"), ids({7, 9, 4}));
  EXPECT_EQ(t.encode("dcb"), ids({4, 2, 1}));  // no merge applies: one token per byte
  EXPECT_EQ(t.encode("a\n\nb"), ids({0, 10, 10, 1}));
  EXPECT_EQ(t.encode("é"), ids({13}));
  EXPECT_EQ(t.encode("a's"), ids({0, 14, 15}));  // the contraction 's is its own pre-token
  EXPECT_EQ(t.vocab_size(), vocab_size);  // tokenizer.json's added <|endoftext|> (16) counts
}

}  // namespace

TEST(BytesToUnicode, FollowsGpt2Table) {
  const auto& t = data::bytes_to_unicode();
  EXPECT_EQ(t['a'], "a");
  EXPECT_EQ(t['!'], "!");
  EXPECT_EQ(t[' '], "\xC4\xA0");   // U+0120 Ġ
  EXPECT_EQ(t['\n'], "\xC4\x8A");  // U+010A Ċ
  EXPECT_EQ(t[0], "\xC4\x80");     // U+0100
  EXPECT_EQ(t[0xAD], "\xC5\x83");  // soft hyphen, the last byte remapped: U+0143
  EXPECT_EQ(t[0xE9], "\xC3\xA9");  // é stands for itself
}

TEST(Pretokenize, FollowsGpt2Pattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(data::pretokenize("I'm here  now\n"), (V{"I", "'m", " here", " ", " now", "\n"}));
  EXPECT_EQ(data::pretokenize("abc123 x!!  \n\ny"), (V{"abc", "123", " x", "!!", "  \n", "\n", "y"}));
  EXPECT_EQ(data::pretokenize("don't they'll 's"), (V{"don", "'t", " they", "'ll", " '", "s"}));
  EXPECT_EQ(data::pretokenize("a\tb  "), (V{"a", "\t", "b", "  "}));
  EXPECT_EQ(data::pretokenize("naïve café 日本"), (V{"naïve", " café", " 日本"}));  // non-ASCII: letters
  EXPECT_EQ(data::pretokenize(" 42"), (V{" 42"}));
  EXPECT_TRUE(data::pretokenize("").empty());
}

TEST(BpeTokenizer, FixedIdsFromTokenizerJsonWithStringMerges) {
  expect_fixed_ids(data::BpeTokenizer::from_tokenizer_json(write_tokenizer_json("bpe_strings", false).string()));
}

TEST(BpeTokenizer, FixedIdsFromTokenizerJsonWithPairMerges) {
  expect_fixed_ids(data::BpeTokenizer::from_tokenizer_json(write_tokenizer_json("bpe_pairs", true).string()));
}

TEST(BpeTokenizer, FixedIdsFromVocabAndMerges) { expect_fixed_ids(vocab_merges_tokenizer(), 16); }

TEST(BpeTokenizer, LoadTokenizerFindsEachLayout) {
  const fs::path json = write_tokenizer_json("bpe_load", false);
  EXPECT_EQ(data::load_tokenizer(json.string())->encode(" abc"), ids({3, 7}));
  EXPECT_EQ(data::load_tokenizer(json.parent_path().string())->encode(" abc"), ids({3, 7}));
  const fs::path dir = temp_dir("bpe_vocab_merges");
  vocab_merges_tokenizer();  // writes vocab.json and merges.txt into that folder (emptied by each temp_dir call)
  EXPECT_EQ(data::load_tokenizer(dir.string())->type(), "byte-level-bpe");
  EXPECT_EQ(data::load_tokenizer((dir / "vocab.json").string())->encode("abc"), ids({7}));
}

TEST(BpeTokenizer, DecodesIdsAndSpecialTokens) {
  const auto t = vocab_merges_tokenizer();
  EXPECT_EQ(t.decode({9, 4, 10, 13}), " abd\né");
  const auto j = data::BpeTokenizer::from_tokenizer_json(write_tokenizer_json("bpe_special", false).string());
  EXPECT_EQ(j.decode({7, 16, 99}), "abc<|endoftext|><99>");
}

TEST(BpeTokenizer, ByteWithoutTokenIsAnError) {
  const auto t = vocab_merges_tokenizer();
  try {
    t.encode("abz");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no token for the byte 0x7A"), std::string::npos) << e.what();
  }
}

TEST(BpeTokenizer, DecodeOfEncodeIsTheTextForEveryByte) {
  // Every byte has a token, plus the merges above: any byte string, valid UTF-8 or not, comes back.
  std::unordered_map<std::string, uint32_t> vocab;
  const auto& table = data::bytes_to_unicode();
  for (uint32_t b = 0; b < 256; ++b) vocab[table[b]] = b;
  std::vector<std::pair<std::string, std::string>> merges;
  uint32_t next = 256;
  for (const auto& m : kMerges) {
    merges.emplace_back(m[0], m[1]);
    vocab.emplace(std::string(m[0]) + m[1], next++);
  }
  const data::BpeTokenizer t(vocab, merges, {}, "test");
  std::mt19937 rng(7);
  const std::string alphabet = "abcd '\n\t!1é";
  for (int trial = 0; trial < 200; ++trial) {
    std::string s;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i)
      s += trial % 2 ? static_cast<char>(rng() % 256) : alphabet[rng() % alphabet.size()];
    const auto encoded = t.encode(s);
    EXPECT_EQ(t.decode(std::vector<int64_t>(encoded.begin(), encoded.end())), s);
  }
  EXPECT_LT(t.encode("abc abc abc").size(), 11u);  // merges did apply
}

TEST(BpeTokenizer, BadFilesSayWhatIsWrong) {
  const fs::path dir = temp_dir("bpe_bad");
  std::ofstream(dir / "not.json") << "{ nope";
  std::ofstream(dir / "unigram.json") << R"({"model": {"type": "Unigram", "vocab": [], "merges": []}})";
  std::ofstream(dir / "missing_merge.json") << R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})";
  auto message = [](const fs::path& p) {
    try {
      data::load_tokenizer(p.string());
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(dir / "not.json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(message(dir / "unigram.json").find("only (byte-level) BPE"), std::string::npos);
  EXPECT_NE(message(dir / "missing_merge.json").find("'b', which is not in the vocabulary"), std::string::npos);
  EXPECT_NE(message(dir / "absent.json").find("does not exist"), std::string::npos);
  EXPECT_NE(message(dir).find("holds no tokenizer.model"), std::string::npos);
}
