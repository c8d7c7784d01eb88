// `crosstrain tokenize` end to end: token file + meta.json + tokenizer, ids that decode to the corpus, uint32 for
// a large vocabulary, and bad input that fails with a message and writes nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crosstrain/data/corpus.h"
#include "crosstrain/data/tokenizer.h"
#include "subprocess.h"
#include "scratch.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

// `crosstrain COMMAND ARGS`: its output (stdout and stderr) and wait status, killed at the support library's deadline.
std::string run(const std::string& args, int* status, const std::string& command = "tokenize") {
  const crosstrain::testing::ProcessResult r =
      crosstrain::testing::run_shell(std::string(CROSSTRAIN_BINARY) + " " + command + " " + args);
  *status = r.status;
  return r.output;
}

// Under the test's own name: ctest runs each test in its own process, several at once.
fs::path fresh(const std::string& name) {
  const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  return crosstrain::testing::scratch_path("tokenize-" + test + "-" + name);
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A folder of two text files, about 40 KB, with fortune's index file that must be skipped.
fs::path corpus() {
  const fs::path dir = fresh("tok_corpus");
  fs::create_directories(dir);
  std::ofstream a(dir / "a"), b(dir / "b");
  for (int i = 0; i < 400; ++i) a << "Line " << i << " of the first file, about tokens and pipelines.\n%\n";
  for (int i = 0; i < 300; ++i) b << "Zweite Datei: Grüße aus " << i * 7 << " Städten.\n";
  std::ofstream(dir / "a.dat") << "\x01\x02 index";
  return dir;
}

std::vector<int64_t> tokens(const fs::path& bin, int width) {
  const std::string bytes = read(bin);
  std::vector<int64_t> ids(bytes.size() / static_cast<size_t>(width));
  for (size_t i = 0; i < ids.size(); ++i) {
    uint64_t v = 0;
    for (int b = 0; b < width; ++b) v |= uint64_t{static_cast<unsigned char>(bytes[i * width + b])} << (8 * b);
    ids[i] = static_cast<int64_t>(v);
  }
  return ids;
}

}  // namespace

TEST(TokenizeCli, TrainsWritesAndDecodesBackToTheCorpus) {
  const fs::path in = corpus(), out = fresh("tok_out"), out1 = fresh("tok_out1");
  int status = 0;
  const std::string log = run(in.string() + " --out " + out.string() + " --vocab-size 400 --threads 2", &status);
  ASSERT_EQ(status, 0) << log;
  EXPECT_NE(log.find("bytes per token"), std::string::npos) << log;
  const auto meta = nlohmann::json::parse(read(out / "meta.json"));
  EXPECT_EQ(meta["vocab_size"], 400);
  EXPECT_EQ(meta["dtype"], "uint16");
  EXPECT_EQ(meta["tokenizer"], "tokenizer.model");
  EXPECT_EQ(meta["tokenizer_type"], "sentencepiece-bpe");
  const std::string text = data::read_corpus(in.string());
  EXPECT_EQ(meta["bytes"], text.size());
  const auto ids = tokens(out / "train.bin", 2);
  EXPECT_EQ(meta["tokens"], ids.size());
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(data::load_tokenizer((out / "tokenizer.model").string())->decode(ids), text);
  // One thread writes the same file: chunks do not depend on the thread count.
  ASSERT_EQ(run(in.string() + " --out " + out1.string() + " --vocab-size 400 --threads 1", &status).empty(), false);
  ASSERT_EQ(status, 0);
  EXPECT_EQ(read(out1 / "train.bin"), read(out / "train.bin"));
}

TEST(TokenizeCli, UnigramWithValidationFile) {
  const fs::path in = corpus(), out = fresh("tok_val");
  int status = 0;
  const std::string log =
      run(in.string() + " --out " + out.string() + " --vocab-size 400 --type unigram --val-fraction 0.1", &status);
  ASSERT_EQ(status, 0) << log;
  const auto meta = nlohmann::json::parse(read(out / "meta.json"));
  EXPECT_EQ(meta["tokenizer_type"], "sentencepiece-unigram");
  EXPECT_EQ(meta["val"], "val.bin");
  const auto train = tokens(out / "train.bin", 2), val = tokens(out / "val.bin", 2);
  EXPECT_EQ(meta["tokens"], train.size() + val.size());
  const auto t = data::load_tokenizer(out.string());
  EXPECT_EQ(t->decode(train) + t->decode(val), data::read_corpus(in.string()));
  EXPECT_GT(val.size(), train.size() / 20);
  EXPECT_LT(val.size(), train.size() / 5);
}

TEST(TokenizeCli, LargeVocabularyWritesUint32AndTrains) {
  // A byte-level BPE whose vocabulary reaches id 70000: every byte has a token, 'Ġ' (space) is id 70000.
  const fs::path in = corpus(), tok = fresh("tok_json"), out = fresh("tok_u32");
  fs::create_directories(tok);
  nlohmann::json vocab = nlohmann::json::object();
  for (int c = '!'; c <= '~'; ++c) vocab[std::string(1, static_cast<char>(c))] = c;  // printable ASCII: itself
  vocab["\xC4\xA0"] = 70000;                                    // Ġ: ' '
  vocab["\xC4\x8A"] = 10;                                       // Ċ: '\n'
  // The bytes of ü ä ß: C3 BC A4 9F; 0x9F is remapped to U+0141.
  vocab["\xC3\x83"] = 300, vocab["\xC2\xBC"] = 301, vocab["\xC2\xA4"] = 302, vocab["\xC5\x81"] = 303;
  vocab["\xC3\x83\xC2\xBC"] = 304;
  std::ofstream(tok / "tokenizer.json")
      << nlohmann::json{{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", {"\xC3\x83 \xC2\xBC"}}}}}.dump();
  int status = 0;
  const std::string log =
      run(in.string() + " --out " + out.string() + " --tokenizer " + (tok / "tokenizer.json").string(), &status);
  ASSERT_EQ(status, 0) << log;
  const auto meta = nlohmann::json::parse(read(out / "meta.json"));
  EXPECT_EQ(meta["dtype"], "uint32");
  EXPECT_EQ(meta["vocab_size"], 70001);
  EXPECT_EQ(meta["tokenizer"], "tokenizer.json");
  EXPECT_EQ(meta["tokenizer_type"], "byte-level-bpe");
  const auto ids = tokens(out / "train.bin", 4);
  EXPECT_EQ(meta["tokens"], ids.size());
  EXPECT_NE(std::find(ids.begin(), ids.end(), 70000), ids.end());
  EXPECT_NE(std::find(ids.begin(), ids.end(), 304), ids.end());  // ü merged
  EXPECT_EQ(data::load_tokenizer((out / "tokenizer.json").string())->decode(ids), data::read_corpus(in.string()));
  // The trainer reads the uint32 file through meta.json, and says which model.vocab_size the data needs.
  const std::string recipe = std::string(CROSSTRAIN_SOURCE_DIR) + "/recipes/gpt-tiny.toml --nproc 1 --set data.path=" +
                             (out / "train.bin").string() + " --set run.dir=" + fresh("tok_u32_run").string();
  const std::string small = run(recipe, &status, "train");
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << small;
  EXPECT_NE(small.find("set model.vocab_size = 70001"), std::string::npos) << small;
  const std::string trained = run(recipe + " --set model.vocab_size=70002 --set model.n_layer=1 --set model.n_embd=32"
                                  " --set model.n_head=2 --set model.block_size=16 --set train.steps=2"
                                  " --set train.global_batch=2 --set train.eval_every=2 --set train.eval_batches=1"
                                  " --set train.sample_tokens=4 --set train.peak_flops_per_rank=1e9",
                                  &status, "train");
  ASSERT_EQ(status, 0) << trained;
  EXPECT_NE(trained.find("uint32 tokens from train.bin"), std::string::npos) << trained;
  EXPECT_NE(trained.find("step 2/2"), std::string::npos) << trained;
}

TEST(TokenizeCli, BadInputFailsClearlyAndWritesNothing) {
  const fs::path in = corpus(), out = fresh("tok_bad"), garbage = fresh("tok_garbage.model");
  std::ofstream(garbage) << "not a sentencepiece model";
  struct Case {
    std::string args, message;
  } cases[] = {
      {"/nonexistent/corpus --out " + out.string(), "does not exist"},
      {in.string() + " --out " + out.string() + " --vocab-size 100", "too small"},
      {in.string() + " --out " + out.string() + " --vocab-size 60000 --type unigram", "choose another --vocab-size"},
      {in.string() + " --out " + out.string() + " --tokenizer " + garbage.string(), "is not a SentencePiece model"},
      {in.string() + " --out " + out.string() + " --tokenizer /nonexistent/tokenizer.json", "does not exist"},
      {in.string() + " --out " + garbage.string(), "is not a folder"},
  };
  for (const auto& c : cases) {
    int status = 0;
    const std::string log = run(c.args, &status);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << c.args << "\n" << log;
    EXPECT_NE(log.find(c.message), std::string::npos) << c.args << "\n" << log;
    EXPECT_FALSE(fs::exists(out)) << c.args;
  }
}
