// sync.mode as a type: each name parses to its mode and back, anything else is refused naming the choices, and
// the traits that the loop, the launcher, elastic training and DLRM ask instead of comparing strings.
#include <gtest/gtest.h>

#include <utility>

#include "crosstrain/core/error.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/sync_mode.h"

using namespace crosstrain;
using train::SyncMode;

namespace {

train::SyncTraits traits(const std::string& mode, bool hierarchical = false) {
  train::SyncConfig c;
  c.mode = train::parse_sync_mode(mode);
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
  EXPECT_TRUE(traits("diloco").elastic);  // a whole cluster leaves and joins
  for (const char* ps : {"ssp", "async"}) {
    EXPECT_TRUE(traits(ps).parameter_server) << ps;
    EXPECT_FALSE(traits(ps).lockstep) << ps;
    EXPECT_TRUE(traits(ps).elastic) << ps;  // the server re-shards over the live workers
  }
  EXPECT_FALSE(traits("gossip").parameter_server);
  EXPECT_TRUE(traits("gossip").elastic);  // it pairs the live ranks
}

// When each mode hears a Ctrl-C: posted every `every` steps and read `lag` steps later (train/stop_vote.h).
TEST(SyncMode, EachModeHearsAStopWhereItWaitsAnyway) {
  auto check = [](const std::string& mode, int64_t inner_steps, int64_t staleness, int64_t period) {
    train::SyncConfig c;
    c.mode = train::parse_sync_mode(mode);
    c.inner_steps = inner_steps;
    c.staleness = staleness;
    c.period = period;
    const train::StopCheck s = train::sync_traits(c).stop_check;
    return std::make_pair(s.every, s.lag);
  };
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(check("sync", 50, 4, 1), P(1, 1));
  EXPECT_EQ(check("diloco", 50, 4, 1), P(50, 1));  // at the outer step, where the clusters meet
  // ssp: a rank staleness + 1 steps ahead waits for the slowest anyway, so reading then costs nothing more.
  EXPECT_EQ(check("ssp", 50, 4, 1), P(5, 5));
  EXPECT_EQ(check("ssp", 50, 0, 1), P(1, 1));
  EXPECT_EQ(check("async", 50, 4, 2), P(0, 0));  // no vote: the pushes carry the request (HeardStop)
  EXPECT_EQ(check("gossip", 50, 4, 3), P(12, 12));
}

// The mode and the model family are parsed once, when the config is read: a recipe or --set with another name is
// refused there, naming the key and the choices, and the saved config.toml writes the recipe's word back.
TEST(SyncMode, TheConfigHoldsParsedNamesAndWritesThemBack) {
  train::Config c;
  train::apply_override(c, "sync.mode=diloco");
  train::apply_override(c, "model.arch=llama");
  EXPECT_EQ(c.sync.mode, SyncMode::DiLoCo);
  EXPECT_EQ(c.model.arch, models::ModelArch::Llama);
  const std::string saved = train::to_toml(c);
  auto holds = [&](const std::string& key, const std::string& word) {  // TOML may quote either way
    return saved.find(key + " = '" + word + "'") != std::string::npos ||
           saved.find(key + " = \"" + word + "\"") != std::string::npos;
  };
  EXPECT_TRUE(holds("mode", "diloco")) << saved;
  EXPECT_TRUE(holds("arch", "llama")) << saved;
  const train::Config again = train::parse_config(saved, "saved config.toml");
  EXPECT_EQ(again.sync.mode, SyncMode::DiLoCo);
  EXPECT_EQ(again.model.arch, models::ModelArch::Llama);
  try {
    train::parse_config("[sync]\nmode = 'paxos'\n", "my-recipe.toml");
    ADD_FAILURE() << "sync.mode = 'paxos' was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sync.mode = 'paxos': use sync"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("my-recipe.toml"), std::string::npos) << e.what();
  }
  for (const char* bad : {"sync.mode=paxos", "model.arch=mamba", "dlrm.mode=gossip", "dlrm.ps_storage=disk"}) {
    train::Config d;
    try {
      train::apply_override(d, bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const UsageError& e) {  // the key's message, and where the value came from
      EXPECT_NE(std::string(e.what()).find(std::string("(--set ") + bad + ")"), std::string::npos) << e.what();
    }
    EXPECT_EQ(d.sync.mode, SyncMode::Sync) << bad;  // nothing was set
    EXPECT_EQ(d.model.arch, models::ModelArch::Gpt) << bad;
  }
}
