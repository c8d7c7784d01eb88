#include <gtest/gtest.h>

#include <ATen/ATen.h>

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
