// Reading a rank's trace file as written (no closing bracket, trailing commas, a torn last line) and merging the
// ranks' files onto rank 0's clock.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/trace_file.h"
#include "synthetic_run.h"
#include "scratch.h"

using crosstrain::UsageError;
using namespace crosstrain::obs;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::string& text) {
  try {
    parse_trace_text(text, "rank-0.json");
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

fs::path fresh_dir(const std::string& name) { return crosstrain::testing::scratch_dir("trace-file-" + name); }

}  // namespace

TEST(TraceFile, ReadsTheArrayWithoutClosingBracketAndWithTrailingComma) {
  const auto events = parse_trace_text("[\n{\"ph\":\"X\",\"ts\":1},\n{\"ph\":\"X\",\"ts\":2},\n", "t");
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[1]["ts"], 2);
}

TEST(TraceFile, ReadsAClosedArrayAndAnEmptyOne) {
  EXPECT_EQ(parse_trace_text("[{\"ph\":\"X\"},{\"ph\":\"M\"}]\n", "t").size(), 2u);
  EXPECT_EQ(parse_trace_text("[\n", "t").size(), 0u);
  EXPECT_EQ(parse_trace_text("", "t").size(), 0u);
}

TEST(TraceFile, DropsATornLastLine) {
  const auto events = parse_trace_text("[\n{\"ph\":\"X\",\"ts\":1},\n{\"ph\":\"X\",\"na", "t");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["ts"], 1);
}

TEST(TraceFile, GarbageIsAUsageErrorNamingFileAndLine) {
  const std::string message = error_of("[\n{\"ph\":\"X\"},\nnot json at all,\n{\"ph\":\"X\"},\n");
  EXPECT_NE(message.find("rank-0.json:3:"), std::string::npos) << message;
  EXPECT_NE(message.find("not json at all"), std::string::npos) << message;
  EXPECT_NE(error_of("{\"traceEvents\": []}").find("rank-0.json:1: "), std::string::npos);
  EXPECT_NE(error_of("[1, 2,\n").find("not a JSON object"), std::string::npos);
}

TEST(TraceFile, ReadsAFileAndNamesAMissingOne) {
  const fs::path dir = fresh_dir("trace_file_read");
  crosstrain::testing::write_trace(dir / "rank-0.json", crosstrain::testing::rank_events(0, 2));
  EXPECT_EQ(read_trace_file((dir / "rank-0.json").string()).size(), 3u + 2 * 7 + 1);
  EXPECT_THROW(read_trace_file((dir / "absent.json").string()), UsageError);
}

TEST(TraceMerge, NoTracesSuggestsObsTrace) {
  const fs::path dir = fresh_dir("trace_merge_none");
  try {
    merge_traces(dir.string());
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("obs.trace = true"), std::string::npos) << e.what();
  }
}

TEST(TraceMerge, AppliesEachRanksOffsetAndSortsByTime) {
  const fs::path dir = fresh_dir("trace_merge_two");
  crosstrain::testing::write_synthetic_run(dir, 3);
  const MergeSummary summary = merge_traces(dir.string());
  EXPECT_EQ(summary.ranks, 2);
  EXPECT_EQ(summary.events, 2 * (3 + 3 * 7 + 1));
  EXPECT_TRUE(summary.ranks_without_clock.empty());
  // Rank 1's clock is 1 s behind: with its offset both ranks' first step starts at 0 on rank 0's clock.
  EXPECT_DOUBLE_EQ(summary.begin_us, 0);
  EXPECT_DOUBLE_EQ(summary.end_us, 300000);
  EXPECT_EQ(summary.path, (dir / "traces" / "merged.json").string());

  std::ifstream in(summary.path);
  const auto merged = nlohmann::json::parse(in);
  EXPECT_EQ(merged["displayTimeUnit"], "ms");
  const auto& events = merged["traceEvents"];
  ASSERT_EQ(events.size(), static_cast<size_t>(summary.events));
  size_t metadata = 0;
  while (metadata < events.size() && events[metadata]["ph"] == "M") ++metadata;
  EXPECT_EQ(metadata, 6u);  // every metadata event first, kept
  double last_ts = -1;
  int rank1_steps_at = 0;
  for (size_t i = metadata; i < events.size(); ++i) {
    EXPECT_NE(events[i]["ph"], "M") << "metadata after timed events at " << i;
    EXPECT_GE(events[i]["ts"].get<double>(), last_ts) << "out of order at " << i;
    last_ts = events[i]["ts"];
    if (events[i]["pid"] == 1 && events[i]["name"] == "step") {
      EXPECT_DOUBLE_EQ(events[i]["ts"].get<double>(), 100000.0 * rank1_steps_at++);
    }
  }
  EXPECT_EQ(rank1_steps_at, 3);
}

TEST(TraceMerge, IgnoresItsOwnOutputAndOtherFiles) {
  const fs::path dir = fresh_dir("trace_merge_again");
  crosstrain::testing::write_synthetic_run(dir, 1);
  std::ofstream(dir / "traces" / "notes.json") << "garbage";
  const int64_t first = merge_traces(dir.string()).events;
  EXPECT_EQ(merge_traces(dir.string()).events, first);  // merged.json is not read as a rank's trace
}

TEST(TraceMerge, KeepsIntegerTimestampsWhole) {
  nlohmann::json rank0 = nlohmann::json::array({{{"ph", "X"}, {"pid", 0}, {"ts", 5}, {"dur", 1}}});
  nlohmann::json rank1 = nlohmann::json::array(
      {{{"ph", "M"}, {"pid", 1}, {"name", "crosstrain_clock"}, {"args", {{"offset_us", 10}}}},
       {{"ph", "X"}, {"pid", 1}, {"ts", -7}, {"dur", 1}},
       {{"ph", "C"}, {"pid", 1}, {"name", "memory"}, {"ts", 0}}});
  const auto events = align_and_sort({rank0, rank1});
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0]["ph"], "M");
  EXPECT_EQ(events[1]["ts"], 3);
  EXPECT_TRUE(events[1]["ts"].is_number_integer());
  EXPECT_EQ(events[2]["ts"], 5);
  EXPECT_EQ(events[3]["ts"], 10);
  EXPECT_EQ(events[3]["name"], "memory");
}

// A resumed run appends to the file: its events follow a clock event of its own, with another offset.
TEST(TraceMerge, EachClockEventAppliesToTheEventsAfterIt) {
  nlohmann::json rank1 = nlohmann::json::array(
      {{{"ph", "M"}, {"pid", 1}, {"name", "crosstrain_clock"}, {"args", {{"offset_us", 100}}}},
       {{"ph", "X"}, {"pid", 1}, {"ts", 1}, {"dur", 1}},
       {{"ph", "M"}, {"pid", 1}, {"name", "crosstrain_clock"}, {"args", {{"offset_us", 5000}}}},
       {{"ph", "X"}, {"pid", 1}, {"ts", 2}, {"dur", 1}}});
  const auto events = align_and_sort({rank1});
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[2]["ts"], 101);
  EXPECT_EQ(events[3]["ts"], 5002);
}
