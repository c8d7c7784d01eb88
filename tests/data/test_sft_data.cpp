// Prompt/response JSONL packing and the loss mask (data/sft.h, data/loss_mask.h): exact ids and flags for a
// two-line file, bad lines named by file and line, windows that must not train across examples, and the
// micro-batch weights that make every layout's loss the global mean.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "crosstrain/core/error.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/loss_mask.h"
#include "crosstrain/data/sft.h"

using namespace crosstrain;
using data::LossMask;

namespace {

std::string write_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::path(::testing::TempDir()) / name;
  std::ofstream(path, std::ios::binary) << text;
  return path.string();
}

std::vector<uint32_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

data::Encoder byte_encoder() {
  return [](const std::string& s) { return bytes_of(s); };
}

// The UsageError message of pack_jsonl on `text`, or "" when it does not throw.
std::string pack_error(const std::string& text, const std::string& name) {
  const std::string path = write_file(name, text);
  try {
    data::pack_jsonl(path, byte_encoder(), 0);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

constexpr uint8_t S = LossMask::kExampleStart, R = LossMask::kTrained;

}  // namespace

TEST(SftPack, TwoLinesGiveExactTokensAndFlags) {
  // A blank line and a CRLF ending are tolerated; other keys are ignored.
  const std::string path = write_file("two.jsonl", "{\"prompt\": \"ab\", \"response\": \"c\", \"id\": 7}\r\n\n"
                                                   "{\"prompt\": \"d\", \"response\": \"ef\"}\n");
  const auto p = data::pack_jsonl(path, byte_encoder(), 9);
  EXPECT_EQ(p.tokens, (std::vector<uint32_t>{'a', 'b', 'c', 9, 'd', 'e', 'f', 9}));
  // Prompt bytes untrained (the first of each example marks its start), response bytes and the end token trained.
  EXPECT_EQ(p.flags, (std::vector<uint8_t>{S, 0, R, R, S, R, R, R}));
  EXPECT_EQ(p.starts, (std::vector<size_t>{0, 4}));
  EXPECT_EQ(p.longest, 4u);
}

TEST(SftPack, EmptyPromptStillDoesNotTrainAcrossExamples) {
  const std::string path = write_file("empty_prompt.jsonl", "{\"prompt\": \"x\", \"response\": \"y\"}\n"
                                                            "{\"prompt\": \"\", \"response\": \"zw\"}\n");
  const auto p = data::pack_jsonl(path, byte_encoder(), 0);
  EXPECT_EQ(p.tokens, (std::vector<uint32_t>{'x', 'y', 0, 'z', 'w', 0}));
  // 'z' would be predicted from the previous example's end token: not trained.
  EXPECT_EQ(p.flags, (std::vector<uint8_t>{S, R, R, S, R, R}));
}

TEST(SftPack, BadLinesNameFileAndLine) {
  const std::string ok = "{\"prompt\": \"a\", \"response\": \"b\"}\n";
  std::string e = pack_error(ok + ok + "{\"prompt\": \"a\", \"response\": \n", "bad_json.jsonl");
  EXPECT_NE(e.find("bad_json.jsonl:3: not valid JSON"), std::string::npos) << e;
  e = pack_error(ok + "{\"prompt\": \"a\"}\n", "no_response.jsonl");
  EXPECT_NE(e.find("no_response.jsonl:2: no \"response\" key"), std::string::npos) << e;
  e = pack_error("\n{\"prompt\": 3, \"response\": \"b\"}\n", "number.jsonl");
  EXPECT_NE(e.find("number.jsonl:2: \"prompt\" is a number, not a string"), std::string::npos) << e;
  e = pack_error("[1, 2]\n", "array.jsonl");
  EXPECT_NE(e.find("array.jsonl:1: a JSON array"), std::string::npos) << e;
  e = pack_error("\n \n", "blank.jsonl");
  EXPECT_NE(e.find("holds no examples"), std::string::npos) << e;
  EXPECT_EQ(pack_error(ok, "fine.jsonl"), "");
}

TEST(SftPack, EosTokenChoice) {
  data::DatasetConfig c;
  EXPECT_EQ(data::eos_token(c), 0u);  // bytes: NUL
  c.eos_token = 5;
  EXPECT_EQ(data::eos_token(c), 5u);
  c.eos_token = -1;
  c.tokenizer = "some/tokenizer.json";
  EXPECT_THROW(data::eos_token(c), UsageError);  // a vocabulary's end token must be named
  c.path = "pairs.jsonl";
  EXPECT_TRUE(data::is_jsonl(c));  // auto, by the extension
  c.format = "text";
  EXPECT_FALSE(data::is_jsonl(c));
  c.path = "pairs.txt";
  c.format = "jsonl";
  EXPECT_TRUE(data::is_jsonl(c));
}

TEST(LossMaskTest, WindowsTrainOnlyWholeExamplesResponses) {
  // Two examples: prompt "ab" response "c" end; prompt "d" response "ef" end (as above).
  auto flags = std::make_shared<std::vector<uint8_t>>(std::vector<uint8_t>{S, 0, R, R, S, R, R, R});
  const LossMask mask(flags);
  const int64_t T = 4;
  // Window at 0: targets predict tokens 1..4 = b c end d: b is prompt, d starts the next example.
  std::vector<int64_t> y(T, 1);
  EXPECT_EQ(mask.apply({0}, T, y.data()), 2);
  EXPECT_EQ(y, (std::vector<int64_t>{data::kIgnoreTarget, 1, 1, data::kIgnoreTarget}));
  // Window at 1 (starts inside the first example, its prompt cut): targets predict c end d e; only e trains.
  y.assign(T, 1);
  EXPECT_EQ(mask.apply({1}, T, y.data()), 1);
  EXPECT_EQ(y, (std::vector<int64_t>{data::kIgnoreTarget, data::kIgnoreTarget, data::kIgnoreTarget, 1}));
  // Two rows at once, row-major; count agrees with apply.
  std::vector<int64_t> rows(2 * T, 1);
  EXPECT_EQ(mask.apply({0, 3}, T, rows.data()), 2 + 3);
  EXPECT_EQ(mask.count({0, 3}, T), 5);
  // A slice (the validation part) indexes from its own start.
  EXPECT_EQ(mask.slice(4, 8).count({0}, 3), 3);
}

TEST(LossMaskTest, MicroBatchWeights) {
  // Unmasked: every micro-batch holds the mean count, weight 1.
  EXPECT_EQ(data::micro_batch_loss_weights({32, 32}, 2, 128, 8), (std::vector<double>{1.0, 1.0}));
  // 4 micro-batches of 2 sequences over a global batch of 8 with 20 counted targets (mean 5 per micro-batch).
  const auto w = data::micro_batch_loss_weights({2, 8, 0, 10}, 2, 20, 8);
  EXPECT_EQ(w, (std::vector<double>{0.4, 1.6, 0.0, 2.0}));
  // Nothing to train in the whole batch: no loss, no NaN.
  EXPECT_EQ(data::micro_batch_loss_weights({0, 0}, 2, 0, 4), (std::vector<double>{0.0, 0.0}));
}

TEST(SftDataset, LoadSplitsByExamplesAndMasksBatches) {
  std::string text;
  for (int i = 0; i < 10; ++i)
    text += "{\"prompt\": \"q" + std::to_string(i) + "?\", \"response\": \"a" + std::to_string(i) + "\"}\n";
  data::DatasetConfig c;
  c.path = write_file("ten.jsonl", text);  // format auto: by the extension
  c.val_fraction = 0.2;
  const data::Splits s = data::load_dataset(c, 5);
  // Each example: "qN?" "aN" end = 6 tokens; 8 for training, 2 for validation, cut between examples.
  EXPECT_EQ(s.train.size(), 48u);
  EXPECT_EQ(s.val.size(), 12u);
  EXPECT_EQ(s.train_mask.size(), 48u);
  EXPECT_EQ(s.val_mask[0], S);
  EXPECT_EQ(s.val[0], static_cast<uint32_t>('q'));
  EXPECT_EQ(s.val[1], static_cast<uint32_t>('8'));
  EXPECT_EQ(s.vocab_size, 256);
  EXPECT_TRUE(s.warning.empty());
  // A batch from an example's start: inputs q0?a0, targets 0?a0<end> with the prompt's masked.
  at::Tensor x, y;
  data::make_batch(s.train, {0}, 5, x, y);
  EXPECT_EQ(s.train_mask.apply({0}, 5, y.data_ptr<int64_t>()), 3);
  const std::vector<int64_t> want{data::kIgnoreTarget, data::kIgnoreTarget, 'a', '0', 0};
  EXPECT_EQ(std::vector<int64_t>(y.data_ptr<int64_t>(), y.data_ptr<int64_t>() + 5), want);
  // Examples longer than a sequence are reported.
  EXPECT_FALSE(data::load_dataset(c, 4).warning.empty());
  c.format = "jsonl";
  c.path = write_file("not_jsonl.txt", "plain text\n");
  EXPECT_THROW(data::load_dataset(c, 4), UsageError);
}

TEST(SftDataset, SubwordTokenizerAndItsEndToken) {
  // A byte-level BPE tokenizer.json (as tests/data/test_bpe.cpp's): "abc" is id 7, " ab" id 9, vocabulary 17.
  const auto dir = std::filesystem::path(::testing::TempDir()) / "sft_bpe";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "tokenizer.json")
      << R"({"version": "1.0", "added_tokens": [{"id": 16, "content": "<|endoftext|>", "special": true}], )"
      << R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "Ġ": 3, "d": 4, "ab": 5, "bc": 6, "abc": 7, )"
      << R"("Ġa": 8, "Ġab": 9, "Ċ": 10, "Ã": 11, "©": 12, "Ã©": 13, "'": 14, "s": 15}, )"
      << R"("merges": ["b c", "a b", "a bc", "Ġ a", "Ġ ab", "Ã ©"]}})";
  std::string text;
  for (int i = 0; i < 8; ++i) text += "{\"prompt\": \"abc\", \"response\": \" ab\"}\n";
  data::DatasetConfig c;
  c.path = write_file("bpe.jsonl", text);
  c.tokenizer = (dir / "tokenizer.json").string();
  c.val_fraction = 0.25;
  EXPECT_THROW(data::load_dataset(c, 2), UsageError);  // no data.eos_token
  c.eos_token = 16;
  const data::Splits s = data::load_dataset(c, 2);
  ASSERT_EQ(s.train.size(), 18u);  // 6 examples of 3 tokens
  EXPECT_EQ((std::vector<uint32_t>{s.train[0], s.train[1], s.train[2], s.train[3]}),
            (std::vector<uint32_t>{7, 9, 16, 7}));
  EXPECT_EQ((std::vector<uint8_t>{s.train_mask[0], s.train_mask[1], s.train_mask[2], s.train_mask[3]}),
            (std::vector<uint8_t>{S, R, R, S}));
  EXPECT_EQ(s.vocab_size, 17);
  EXPECT_EQ(s.tokenizer, c.tokenizer);
}
