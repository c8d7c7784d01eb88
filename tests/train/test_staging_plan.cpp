// Pure: which checkpoint files go from which site to which (train/staging_plan.h), and peers' reports refused.
#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/train/staging_plan.h"

using namespace crosstrain::train;

namespace {

const StagedFile kA{100, "00000000000000aa"}, kB{250, "00000000000000bb"}, kC{70, "00000000000000cc"};

// A step whose files are rank-0 (kA), rank-1 (kB), rank-2 (kC); `have` maps the rank to the bytes held.
StepHolding holding(int64_t step, std::map<int, int64_t> have, bool committed = false) {
  StepHolding h;
  h.step = step;
  h.committed = committed;
  h.files = {{"rank-00000.safetensors", kA}, {"rank-00001.safetensors", kB}, {"rank-00002.safetensors", kC}};
  for (const auto& [rank, bytes] : have) h.have["rank-0000" + std::to_string(rank) + ".safetensors"] = bytes;
  return h;
}

std::string names(const std::vector<Transfer>& plan) {
  std::string out;
  for (const Transfer& t : plan)
    out += std::to_string(t.step) + ":" + t.file.substr(5, 5) + " " + std::to_string(t.from) + "->" +
           std::to_string(t.to) + "@" + std::to_string(t.offset) + " ";
  return out;
}

}  // namespace

// Three sites, each holding its own rank's file of step 10: every site gets the two others, each from its writer.
TEST(StagingPlan, EverySiteGetsEveryOtherSitesFilesFromTheirHolder) {
  const std::vector<SiteInventory> sites = {{{holding(10, {{0, 100}})}},
                                            {{holding(10, {{1, 250}})}},
                                            {{holding(10, {{2, 70}})}}};
  EXPECT_EQ(names(plan_staging(sites)),
            "10:00001 1->0@0 10:00002 2->0@0 10:00000 0->1@0 10:00002 2->1@0 10:00000 0->2@0 10:00001 1->2@0 ");
}

// Newest first: step 20 is planned while step 10 is still incomplete; step 10 waits for a later round.
TEST(StagingPlan, TheNewestStepGoesFirst) {
  const std::vector<SiteInventory> sites = {{{holding(10, {{0, 100}}), holding(20, {{0, 100}})}},
                                            {{holding(10, {{1, 250}, {2, 70}}), holding(20, {{1, 250}, {2, 70}})}}};
  const auto plan = plan_staging(sites);
  ASSERT_FALSE(plan.empty());
  for (const Transfer& t : plan) EXPECT_EQ(t.step, 20) << names(plan);
  // Once site 0 has committed 20, its copy of 10 is never wanted again; site 1 still lacks rank-0's file of 20.
  const std::vector<SiteInventory> later = {
      {{holding(10, {{0, 100}}), holding(20, {{0, 100}, {1, 250}, {2, 70}}, true)}},
      {{holding(10, {{1, 250}, {2, 70}}), holding(20, {{1, 250}, {2, 70}})}}};
  EXPECT_EQ(names(plan_staging(later)), "20:00000 0->1@0 ");
}

// A file cut off midway continues from the bytes the receiver holds.
TEST(StagingPlan, APartialFileResumesAtItsLastByte) {
  const std::vector<SiteInventory> sites = {{{holding(10, {{0, 100}, {1, 250}, {2, 70}}, true)}},
                                            {{holding(10, {{0, 37}, {1, 250}})}}};
  const auto plan = plan_staging(sites);
  EXPECT_EQ(names(plan), "10:00000 0->1@37 10:00002 0->1@0 ");
  EXPECT_EQ(plan[0].whole, kA);
}

// Two placements saved step 10 differently (another layout): their files are never pieced together; a site with
// nobody to get a file from gets nothing; a step older than the site's newest commit is not staged.
TEST(StagingPlan, SitesThatDisagreeOnAStepsFilesNeverMixThem) {
  StepHolding other = holding(10, {{0, 100}, {1, 250}, {2, 70}}, true);
  other.files["rank-00001.safetensors"].checksum = "00000000000000ff";
  EXPECT_TRUE(plan_staging({{{other}}, {{holding(10, {{0, 100}})}}}).empty());
  EXPECT_TRUE(plan_staging({{{holding(10, {{0, 100}})}}, {{holding(10, {{0, 100}})}}}).empty()) << "no holder";
  EXPECT_TRUE(plan_staging({{{holding(10, {{0, 100}, {1, 250}, {2, 70}}, true)}},
                            {{holding(10, {{0, 100}}), holding(12, {{0, 100}, {1, 250}, {2, 70}}, true)}}})
                  .empty())
      << "site 1 has committed a newer checkpoint";
}

TEST(StagingPlan, ReportsRoundTripAndHostileOnesAreRefused) {
  SiteInventory mine{{holding(10, {{0, 100}, {1, 3}}), holding(8, {{0, 100}, {1, 250}, {2, 70}}, true)}};
  const SiteInventory back = inventory_from_json(inventory_to_json(mine));
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.steps[0].have, mine.steps[0].have);
  EXPECT_EQ(back.steps[1].files, mine.steps[1].files);
  EXPECT_TRUE(back.steps[1].committed);

  const auto refused = [&](const std::function<void(nlohmann::json&)>& spoil) {
    nlohmann::json j = inventory_to_json(mine);
    spoil(j);
    try {
      inventory_from_json(j);
    } catch (const crosstrain::Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const auto files = [](nlohmann::json& j) -> nlohmann::json& { return j["steps"][0]["files"]; };
  EXPECT_NE(refused([&](nlohmann::json& j) { files(j)["../../etc/passwd"] = {5, "00000000000000aa"}; }).find(
                "no checkpoint piece file"),
            std::string::npos);
  EXPECT_NE(refused([&](nlohmann::json& j) { files(j)["rank-00000.safetensors"][0] = int64_t{1} << 50; })
                .find("out of bounds"),
            std::string::npos);
  EXPECT_NE(refused([&](nlohmann::json& j) { files(j)["rank-00000.safetensors"][1] = "zz"; }).find("checksum"),
            std::string::npos);
  EXPECT_NE(refused([&](nlohmann::json& j) { j["steps"][0]["have"]["rank-00001.safetensors"] = 251; })
                .find("out of bounds"),
            std::string::npos);
  EXPECT_NE(refused([&](nlohmann::json& j) { j["steps"][0]["have"]["rank-00009.safetensors"] = 1; }).find("not part"),
            std::string::npos);
  const auto too_many_steps = [](nlohmann::json& j) {
    for (int i = 0; i < 64; ++i) j["steps"].push_back(j["steps"][0]);
  };
  EXPECT_NE(refused(too_many_steps).find("at most 64"), std::string::npos);
  EXPECT_NE(refused([&](nlohmann::json& j) { j["steps"][0]["committed"] = "yes"; }), "accepted");
  EXPECT_TRUE(is_piece_file_name("rank-00003.safetensors"));
  EXPECT_FALSE(is_piece_file_name("rank-.safetensors"));
  EXPECT_FALSE(is_piece_file_name("rank-0/../x.safetensors"));
}

// The run's outputs go from the first site (rank 0's) to the others: appended where a site's copy left off, whole
// where it is longer or the same length but other bytes; nothing where it is the same.
TEST(StagingPlan, TheRunsOutputsFollowFromTheFirstSiteAppendedWhereACopyLeftOff) {
  const StagedFile now{900, "0000000000000900"};
  SiteInventory first, behind, longer, same, none;
  first.outputs["metrics.jsonl"] = now;
  behind.outputs["metrics.jsonl"] = {600, "0000000000000600"};
  longer.outputs["metrics.jsonl"] = {1200, "0000000000001200"};
  same.outputs["metrics.jsonl"] = now;
  const auto plan = plan_outputs({first, behind, longer, same, none});
  ASSERT_EQ(plan.size(), 3u);
  EXPECT_EQ(plan[0], (Transfer{-1, "metrics.jsonl", 0, 1, 600, now}));
  EXPECT_EQ(plan[1], (Transfer{-1, "metrics.jsonl", 0, 2, 0, now}));
  EXPECT_EQ(plan[2], (Transfer{-1, "metrics.jsonl", 0, 4, 0, now}));
  EXPECT_TRUE(plan_outputs({none, behind}).empty()) << "only the first site's outputs are sent";
  nlohmann::json j = inventory_to_json(first);
  j["outputs"]["../secrets"] = {1, "0000000000000001"};
  EXPECT_THROW(inventory_from_json(j), crosstrain::Error);
}
