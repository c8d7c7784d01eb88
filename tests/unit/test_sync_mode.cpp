// sync.mode as a type: each name parses to its mode and back, anything else is refused naming the choices, and
// the traits that the loop, the launcher, elastic training and DLRM ask instead of comparing strings.
#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/train/sync_mode.h"

using namespace crosstrain;
using train::SyncMode;

namespace {

train::SyncTraits traits(const std::string& mode, bool hierarchical = false) {
  train::SyncConfig c;
  c.mode = mode;
  c.hierarchical = hierarchical;
  return train::sync_traits(c);
}

}  // namespace

TEST(SyncMode, EveryNameParsesToItsModeAndBack) {
  for (const char* name : {"sync", "diloco", "ssp", "async", "gossip"})
    EXPECT_STREQ(train::to_string(train::parse_sync_mode(name)), name);
  EXPECT_EQ(train::parse_sync_mode("diloco"), SyncMode::DiLoCo);
}

TEST(SyncMode, AnUnknownNameIsRefusedNamingTheChoices) {
  try {
    train::parse_sync_mode("Sync");
    FAIL() << "a mode spelled differently was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sync.mode = 'Sync': use sync, diloco, ssp, async, gossip"), std::string::npos)
        << e.what();
  }
}

TEST(SyncMode, TraitsSayWhatEachModeImplies) {
  EXPECT_TRUE(traits("sync").lockstep);
  EXPECT_TRUE(traits("sync").elastic);
  EXPECT_FALSE(traits("sync").cluster_groups);
  EXPECT_TRUE(traits("sync", /*hierarchical=*/true).cluster_groups);
  EXPECT_FALSE(traits("sync", /*hierarchical=*/true).elastic);
  EXPECT_TRUE(traits("diloco").cluster_groups);
  EXPECT_FALSE(traits("diloco").lockstep);
  for (const char* ps : {"ssp", "async"}) {
    EXPECT_TRUE(traits(ps).parameter_server) << ps;
    EXPECT_FALSE(traits(ps).lockstep) << ps;
  }
  EXPECT_FALSE(traits("gossip").parameter_server);
  EXPECT_FALSE(traits("gossip").elastic);
}
