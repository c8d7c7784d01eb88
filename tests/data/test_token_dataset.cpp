// Token files as the trainer reads them: uint16 and uint32, meta.json beside them, the vocabulary check.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sentencepiece_tokenizer.h"
#include "crosstrain/data/token_file.h"
#include "crosstrain/data/tokenizer.h"
#include "scratch.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

fs::path fresh_dir(const std::string& name) { return crosstrain::testing::scratch_dir("token-dataset-" + name); }

std::vector<uint32_t> ramp(size_t n, uint32_t scale) {
  std::vector<uint32_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint32_t>(i) * scale;
  return v;
}

void write(const fs::path& path, const std::vector<uint32_t>& tokens, const std::string& dtype) {
  data::write_file_atomically(path.string(), data::token_file_bytes(tokens, dtype));
}

void write_meta(const fs::path& dir, const std::string& dtype, int64_t vocab, const std::string& val = "") {
  data::TokenMeta m;
  m.dtype = dtype;
  m.vocab_size = vocab;
  m.tokenizer = "tokenizer.model";
  m.val = val;
  data::write_file_atomically((dir / "meta.json").string(), data::token_meta_json(m));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(TokenFiles, Uint32WithMetaJsonLoadsAndBatches) {
  const fs::path dir = fresh_dir("u32_meta");
  write(dir / "train.bin", ramp(1000, 100), "uint32");  // ids up to 99900: beyond uint16
  write_meta(dir, "uint32", 100000);
  data::DatasetConfig c;
  c.path = (dir / "train.bin").string();
  c.val_fraction = 0.1;
  const auto s = data::load_dataset(c, 16);
  EXPECT_EQ(s.train.bytes_per_token(), 4);
  EXPECT_EQ(s.train.size(), 900u);
  EXPECT_EQ(s.val[0], 90000u);
  EXPECT_EQ(s.train.max_token(), 89900u);
  EXPECT_EQ(s.vocab_size, 100000);
  EXPECT_EQ(s.tokenizer, (dir / "tokenizer.model").string());
  at::Tensor x, y;
  data::make_batch(s.train, {0, 700}, 16, x, y);
  EXPECT_EQ(x[1][0].item<int64_t>(), 70000);
  EXPECT_EQ(y[1][0].item<int64_t>(), 70100);
  EXPECT_NO_THROW(data::check_vocab(s, 100000, c.path));
  EXPECT_NE(error_of([&] { data::check_vocab(s, 65536, c.path); }).find("set model.vocab_size = 100000"),
            std::string::npos);
}

TEST(TokenFiles, TokenBeyondVocabularyIsNamed) {
  const fs::path dir = fresh_dir("u16_plain");
  write(dir / "tokens.bin", ramp(500, 3), "uint16");
  data::DatasetConfig c;
  c.path = (dir / "tokens.bin").string();
  const auto s = data::load_dataset(c, 8);
  EXPECT_EQ(s.train.bytes_per_token(), 2);
  EXPECT_EQ(s.vocab_size, 0);
  const std::string e = error_of([&] { data::check_vocab(s, 1000, c.path); });
  EXPECT_NE(e.find("holds token 1497 but model.vocab_size is 1000; set model.vocab_size to at least 1498"),
            std::string::npos) << e;
}

TEST(TokenFiles, Bin32FormatWithoutMetaAndConflicts) {
  const fs::path dir = fresh_dir("bin32");
  write(dir / "t.bin", ramp(300, 1000), "uint32");
  data::DatasetConfig c;
  c.path = (dir / "t.bin").string();
  c.format = "bin32";
  EXPECT_EQ(data::load_dataset(c, 8).train[200], 200000u);
  c.format = "bin";  // read as uint16: twice the tokens, and the last one is not what was written
  EXPECT_EQ(data::load_dataset(c, 8).train.bytes_per_token(), 2);
  write_meta(dir, "uint16", 1000);
  c.format = "bin32";
  EXPECT_NE(error_of([&] { data::load_dataset(c, 8); }).find("meta.json beside"), std::string::npos);
  write(dir / "odd.bin", ramp(301, 1), "uint16");  // 602 bytes: not whole uint32 tokens
  write_meta(dir, "uint32", 1000);
  c.path = (dir / "odd.bin").string();
  c.format = "auto";
  EXPECT_NE(error_of([&] { data::load_dataset(c, 8); }).find("not a whole number of uint32 tokens"),
            std::string::npos);
  c.format = "bin64";
  EXPECT_NE(error_of([&] { data::load_dataset(c, 8); }).find("bin32 (uint32)"), std::string::npos);
}

TEST(TokenFiles, ValidationFileNamedByMeta) {
  const fs::path dir = fresh_dir("with_val");
  write(dir / "train.bin", ramp(400, 1), "uint16");
  write(dir / "val.bin", ramp(50, 2), "uint16");
  write_meta(dir, "uint16", 1000, "val.bin");
  data::DatasetConfig c;
  c.path = (dir / "train.bin").string();
  c.val_fraction = 0.5;  // not used: meta.json names the validation file
  const auto s = data::load_dataset(c, 8);
  EXPECT_EQ(s.train.size(), 400u);
  EXPECT_EQ(s.val.size(), 50u);
  EXPECT_EQ(s.val[49], 98u);
}

TEST(TokenFiles, DtypeFollowsVocabulary) {
  EXPECT_EQ(data::dtype_for_vocab(65536), "uint16");
  EXPECT_EQ(data::dtype_for_vocab(65537), "uint32");
  EXPECT_NE(error_of([] { data::token_file_bytes({65536}, "uint16"); }).find("does not fit"), std::string::npos);
  EXPECT_EQ(data::token_file_bytes({0x01020304}, "uint32"), std::string("\x04\x03\x02\x01", 4));  // little-endian
}

// libsentencepiece's protobuf copy and libtorch's libprotobuf in one process: the module keeps them apart (a direct
// link crashes before main). This process has libtorch loaded; train, save, and find the tokenizer through
// meta.json as the end-of-training sample does.
TEST(TokenFiles, SentencePieceWorksBesideLibtorchAndIsFoundThroughMeta) {
  EXPECT_EQ(at::ones({2}).sum().item<float>(), 2.0f);
  std::string text;
  for (int i = 0; i < 300; ++i) text += "tokens for the model " + std::to_string(i % 17) + " and the pipeline\n";
  size_t pos = 0;
  data::SentencePieceTraining options;
  options.vocab_size = 300;
  const auto t = data::SentencePieceTokenizer::train(options, [&](std::string& line) {
    if (pos >= text.size()) return false;
    const size_t end = text.find('\n', pos);
    line = text.substr(pos, end - pos);
    pos = end + 1;
    return true;
  });
  const auto ids = t.encode(text);
  const fs::path dir = fresh_dir("sp_meta");
  data::write_file_atomically((dir / "tokenizer.model").string(), t.serialized());
  write(dir / "train.bin", ids, "uint16");
  write_meta(dir, "uint16", 300);
  data::DatasetConfig c;
  c.path = (dir / "train.bin").string();
  const auto found = data::data_tokenizer(c);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->decode(std::vector<int64_t>(ids.begin(), ids.end())), text);
  c.format = "text";
  EXPECT_FALSE(data::data_tokenizer(c));  // bytes
}
