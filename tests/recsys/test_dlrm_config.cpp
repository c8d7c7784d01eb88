// The [dlrm] section's parsed forms and checks.
#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/recsys/dlrm_config.h"

using crosstrain::UsageError;
using crosstrain::recsys::DlrmConfig;

namespace {

std::string refusal(const DlrmConfig& c) {
  try {
    crosstrain::recsys::check_dlrm(c);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(DlrmConfig, TablesTakeListsAndRepeats) {
  DlrmConfig c;
  c.tables = "3x10,7,2x5";
  EXPECT_EQ(c.table_rows(), (std::vector<int64_t>{10, 10, 10, 7, 5, 5}));
  c.bottom_mlp = "";
  c.embedding_dim = 4;
  EXPECT_EQ(c.bottom_widths(), (std::vector<int64_t>{4})) << "an empty bottom MLP is one layer to embedding_dim";
  c.top_mlp = "8,2";
  EXPECT_EQ(c.top_widths(), (std::vector<int64_t>{8, 2, 1}));
}

TEST(DlrmConfig, ParameterCountAddsTablesAndBothMlps) {
  DlrmConfig c;
  c.tables = "100,50";
  c.embedding_dim = 4;
  c.dense_features = 3;
  c.bottom_mlp = "8";
  c.top_mlp = "6";
  // tables 600; bottom (3+1)*8 + (8+1)*4 = 68; top input 4 + 3*2/2 = 7: (7+1)*6 + (6+1)*1 = 55.
  EXPECT_EQ(c.parameter_count(), 600 + 68 + 55);
}

TEST(DlrmConfig, NamedValuesParseOnceAndABadNameListsTheChoices) {
  using namespace crosstrain::recsys;
  for (const char* name : {"sharded", "ps"}) EXPECT_STREQ(to_string(parse_dlrm_mode(name)), name);
  for (const char* name : {"memory", "mmap"}) EXPECT_STREQ(to_string(parse_table_storage(name)), name);
  for (const char* name : {"sum", "mean"}) EXPECT_STREQ(to_string(parse_pooling(name)), name);
  EXPECT_EQ(parse_dlrm_mode("ps"), DlrmMode::ParameterServer);
  auto refused = [](auto parse, const char* name) {
    try {
      parse(name);
    } catch (const crosstrain::UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(refused(parse_dlrm_mode, "gossip").find("dlrm.mode = 'gossip': use sharded, ps"), std::string::npos);
  EXPECT_NE(refused(parse_table_storage, "disk").find("dlrm.ps_storage = 'disk': use memory, mmap"), std::string::npos);
  EXPECT_NE(refused(parse_pooling, "max").find("dlrm.pooling = 'max': use sum, mean"), std::string::npos);
}

TEST(DlrmConfig, BadValuesNameTheirKey) {
  DlrmConfig c;
  c.tables = "10,x";
  EXPECT_NE(refusal(c).find("dlrm.tables"), std::string::npos);
  c.tables = "0";
  EXPECT_NE(refusal(c).find("dlrm.tables"), std::string::npos);
  c = DlrmConfig{};
  c.data = "/some/criteo.tsv";  // 26 categorical features need 26 tables
  EXPECT_NE(refusal(c).find("26"), std::string::npos);
  EXPECT_EQ(refusal(DlrmConfig{}), "") << "the defaults are valid";
}
