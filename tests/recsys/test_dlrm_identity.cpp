// Which [dlrm] fields make a checkpoint another model's (recsys/dlrm_identity.h), as --resume reports them.
#include <gtest/gtest.h>

#include "crosstrain/recsys/dlrm_identity.h"

using crosstrain::recsys::DlrmConfig;
using crosstrain::recsys::dlrm_model_differences;
using Lines = std::vector<std::string>;

TEST(DlrmIdentity, TheSameTablesAndMlpsHaveNoDifferencesHoweverWritten) {
  DlrmConfig saved;
  saved.tables = "2x1000,500";
  DlrmConfig now = saved;
  now.tables = "1000,1000,500";
  now.sharding = "row";
  now.sparse_lr = 0.5;
  now.mode = crosstrain::recsys::DlrmMode::ParameterServer;
  now.data = "other.tsv";
  EXPECT_EQ(dlrm_model_differences(saved, now), Lines{});
}

TEST(DlrmIdentity, EachShapeFieldIsNamedWithBothValues) {
  const DlrmConfig saved;
  DlrmConfig now = saved;
  now.tables = "4x1000";
  now.embedding_dim = 32;
  now.dense_features = 10;
  now.bottom_mlp = "128";
  now.top_mlp = "64";
  now.pooling = crosstrain::recsys::Pooling::Mean;
  EXPECT_EQ(dlrm_model_differences(saved, now),
            (Lines{"dlrm.tables: \"8x1000\" -> \"4x1000\"", "dlrm.embedding_dim: 16 -> 32", "dlrm.dense_features: 13 -> 10",
                   "dlrm.bottom_mlp: \"64\" -> \"128\"", "dlrm.top_mlp: \"64,32\" -> \"64\"",
                   "dlrm.pooling: \"sum\" -> \"mean\""}));
}

TEST(DlrmIdentity, ATextThatDoesNotParseComparesAsText) {
  const DlrmConfig saved;
  DlrmConfig now = saved;
  now.tables = "lots";
  EXPECT_EQ(dlrm_model_differences(saved, now), Lines{"dlrm.tables: \"8x1000\" -> \"lots\""});
}
