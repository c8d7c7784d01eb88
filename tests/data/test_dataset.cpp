#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/data/dataset.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {
fs::path temp(const std::string& name) { return fs::path(::testing::TempDir()) / name; }
std::string error_of(const data::DatasetConfig& c, int64_t block) {
  try {
    data::load_dataset(c, block);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Dataset, Uint16TokenFileSplitsAndBatches) {
  auto path = temp("tokens.bin");
  {
    std::ofstream out(path, std::ios::binary);
    for (uint16_t t = 0; t < 1000; ++t) {
      uint16_t v = static_cast<uint16_t>(t * 7 % 50000);
      out.write(reinterpret_cast<const char*>(&v), 2);
    }
  }
  data::DatasetConfig c;
  c.path = path.string();
  c.val_fraction = 0.1;
  auto s = data::load_dataset(c, 16);
  EXPECT_EQ(s.train.size(), 900u);
  EXPECT_EQ(s.val.size(), 100u);
  EXPECT_EQ(s.val[0], static_cast<uint16_t>(900 * 7 % 50000));
  EXPECT_EQ(s.train.max_token(), static_cast<uint16_t>(899 * 7));
  at::Tensor x, y;
  data::make_batch(s.train, {0, 10}, 16, x, y);
  EXPECT_EQ(x.sizes(), (std::vector<int64_t>{2, 16}));
  EXPECT_EQ(x[1][0].item<int64_t>(), 70);
  EXPECT_EQ(y[1][0].item<int64_t>(), 77);  // targets are the next tokens
  EXPECT_TRUE(at::equal(x.slice(1, 1), y.slice(1, 0, 15)));
}

TEST(Dataset, TextFolderSkipsIndexFiles) {
  auto dir = temp("corpus_dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "b.txt") << std::string(200, 'b');
  std::ofstream(dir / "a.txt") << std::string(100, 'a');
  std::ofstream(dir / "a.dat") << std::string(50, 'z');
  data::DatasetConfig c;
  c.path = dir.string();
  c.val_fraction = 0.2;
  auto s = data::load_dataset(c, 8);
  EXPECT_EQ(s.train.size() + s.val.size(), 300u);  // the .dat index is not text
  EXPECT_EQ(s.train[0], 'a');                       // files in name order
  EXPECT_EQ(s.val[0], 'b');
  EXPECT_NE(s.description.find("2 files"), std::string::npos);
}

TEST(Dataset, BadFilesAreClearErrors) {
  data::DatasetConfig c;
  c.path = temp("missing.txt").string();
  EXPECT_NE(error_of(c, 8).find("does not exist"), std::string::npos);
  auto odd = temp("odd.bin");
  std::ofstream(odd, std::ios::binary) << "abc";
  c.path = odd.string();
  EXPECT_NE(error_of(c, 8).find("not a whole number of uint16 tokens"), std::string::npos);
  auto small = temp("small.txt");
  std::ofstream(small) << "tiny";
  c.path = small.string();
  EXPECT_NE(error_of(c, 8).find("too small"), std::string::npos);
  c.path = "";
  EXPECT_NE(error_of(c, 8).find("data.path is not set"), std::string::npos);
  c.path = small.string();
  c.format = "csv";
  EXPECT_NE(error_of(c, 2).find("data.format 'csv'"), std::string::npos);
}

TEST(Dataset, DevicesAndPipesAreRefusedUnread) {
  // /dev/zero never ends: reading it to the end would fill memory. It is refused from its type alone.
  data::DatasetConfig c;
  c.path = "/dev/zero";
  auto what = error_of(c, 8);
  EXPECT_NE(what.find("data.path '/dev/zero' is not a regular file or a folder"), std::string::npos) << what;
  c.format = "bin";
  EXPECT_NE(error_of(c, 8).find("not a regular file"), std::string::npos);
  auto fifo = temp("corpus.fifo");
  fs::remove(fifo);
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);  // opening it for reading would block forever
  c.path = fifo.string();
  c.format = "auto";
  EXPECT_NE(error_of(c, 8).find("not a regular file"), std::string::npos);
  fs::remove(fifo);
}

TEST(Dataset, TextLargerThanMemoryIsRefusedUnread) {
  // A sparse file far larger than this machine's memory: refused from its size, before a byte is read. The
  // child may grow by 1 GiB only, so a loader that did read it fails fast instead of exhausting the machine.
  auto huge = temp("huge.txt");
  {
    std::ofstream(huge) << "x";
  }
  fs::resize_file(huge, uint64_t{1} << 42);  // 4 TiB, sparse
  auto load_capped = [&] {
    uint64_t mapped_kib = 0;  // what the process maps already (libraries, stacks), plus 1 GiB to grow in
    std::ifstream status("/proc/self/status");
    for (std::string key; status >> key;)
      if (key == "VmSize:") status >> mapped_kib;
    struct rlimit cap {};
    cap.rlim_cur = cap.rlim_max = mapped_kib * 1024 + (uint64_t{1} << 30);
    setrlimit(RLIMIT_AS, &cap);
    data::DatasetConfig c;
    c.path = huge.string();
    const auto what = error_of(c, 8);
    std::fprintf(stderr, "%s\n", what.c_str());
    std::_Exit(what.find("of memory per rank") != std::string::npos ? 0 : 1);
  };
  EXPECT_EXIT(load_capped(), ::testing::ExitedWithCode(0), "data.path '.*huge.txt' holds 4096.0 GiB of text");
  fs::remove(huge);
}

TEST(Dataset, TextThatLooksBinaryGetsAWarning) {
  data::DatasetConfig c;
  c.val_fraction = 0;
  auto text = temp("plain.txt");
  std::ofstream(text) << std::string(300, 'a') << "\n\tÜber café naïve\r\n" << std::string(300, 'b');
  c.path = text.string();
  auto s = data::load_dataset(c, 8);
  EXPECT_EQ(s.warning, "");
  auto binary = temp("random.txt");
  {
    std::ofstream out(binary, std::ios::binary);
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < 4096; ++i) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      out.put(static_cast<char>(x & 0xFF));
    }
  }
  c.path = binary.string();
  s = data::load_dataset(c, 8);  // still loads: a warning, not an error
  EXPECT_EQ(s.train.size(), 4096u);
  EXPECT_NE(s.warning.find("does not look like text"), std::string::npos) << s.warning;
  EXPECT_NE(s.warning.find(binary.string()), std::string::npos) << s.warning;
  auto zeros = temp("zeros.txt");
  std::ofstream(zeros, std::ios::binary) << std::string(1000, '\0');
  c.path = zeros.string();
  EXPECT_NE(data::load_dataset(c, 8).warning.find("100%"), std::string::npos);
}
