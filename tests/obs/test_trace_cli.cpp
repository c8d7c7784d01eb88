// Observability of real jobs (issue 14): the traces every rank writes, merged onto rank 0's clock; a slowed rank
// named as the straggler; a clean run without a warning; a held-back collective named by the others' timeout.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "cli_fixture.h"

namespace crosstrain::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

nlohmann::json read_trace(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  if (!text.empty() && text.back() != ']') text += "]";
  return nlohmann::json::parse(text);
}

std::set<std::string> categories(const nlohmann::json& events) {
  std::set<std::string> out;
  for (const auto& e : events)
    if (e.value("ph", "") == "X") out.insert(e.value("cat", ""));
  return out;
}

// `crosstrain trace merge` as a user runs it; returns the merged events.
nlohmann::json merge(const std::string& dir) {
  const ProcessResult r = run_process({kBin, "trace", "merge", dir});
  EXPECT_EQ(r.exit_code(), 0) << r.output;
  std::ifstream in(fs::path(dir) / "traces" / "merged.json");
  return nlohmann::json::parse(in)["traceEvents"];
}

// The merged timeline is ordered, holds every rank, and the ranks' spans of one collective overlap on the
// common clock (they cannot finish before every member issued it).
void expect_merged_timeline(const nlohmann::json& merged, int ranks) {
  double last = -1;
  std::set<int> pids;
  std::map<std::pair<std::string, int64_t>, std::vector<std::pair<double, double>>> collectives;
  for (const auto& e : merged) {
    if (e.value("ph", "") != "X") continue;
    const double ts = e["ts"].get<double>();
    ASSERT_GE(ts, last) << "the merged timeline is not ordered at " << e.dump();
    last = ts;
    pids.insert(e["pid"].get<int>());
    if (e["cat"] == "comm" && e["name"] == "all_reduce" && e["args"].value("group", "") == "world")
      collectives[{e["args"]["group"], e["args"]["seq"]}].push_back({ts, ts + e["dur"].get<double>()});
  }
  EXPECT_EQ(static_cast<int>(pids.size()), ranks);
  int checked = 0;
  for (const auto& [key, spans] : collectives) {
    if (static_cast<int>(spans.size()) != ranks) continue;
    double latest_start = 0, earliest_end = 1e300;
    for (const auto& [start, end] : spans) {
      latest_start = std::max(latest_start, start);
      earliest_end = std::min(earliest_end, end);
    }
    // 1 ms of slack: the offsets are estimated to within half a loopback round trip.
    EXPECT_LE(latest_start, earliest_end + 1000) << "all_reduce #" << key.second << " does not overlap across ranks";
    ++checked;
  }
  EXPECT_GT(checked, 0);
}

TEST(Traces, TwoRanksRecordEverySpanKindAndMergeOntoOneClock) {
  const std::string dir = fresh_dir("trace-dp2");
  auto args = tiny_args(dir, 2, 12);
  args.insert(args.end(), {"--set", "train.eval_every=5", "--set", "train.checkpoint_every=5", "--set",
                           "obs.trace_flush_every=4"});
  const ProcessResult r = run_process(args, {}, std::chrono::minutes(3));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  for (int rank = 0; rank < 2; ++rank) {
    const auto events = read_trace(dir + "/traces/rank-" + std::to_string(rank) + ".json");
    const auto cats = categories(events);
    for (const char* kind : {"step", "data", "compute", "optimizer", "wait", "comm", "sync", "checkpoint", "eval"})
      EXPECT_TRUE(cats.count(kind)) << "rank " << rank << " has no '" << kind << "' span";
    int forward = 0, comm_with_fields = 0;
    bool memory = false, clock = false;
    for (const auto& e : events) {
      if (e.value("name", "") == "crosstrain_clock") {
        // Rank 1 measured its offset by ping-pongs over loopback: a round trip takes time, and on one machine
        // (one monotonic clock) the true offset is 0, so the estimate is within half a round trip of it.
        const auto rtt = e["args"]["rtt_us"].get<int64_t>(), offset = e["args"]["offset_us"].get<int64_t>();
        if (rank == 1) EXPECT_GT(rtt, 0);
        EXPECT_LE(std::abs(offset), rtt / 2 + 1) << e.dump();
        clock = true;
      }
      if (e.value("name", "") == "forward") ++forward;
      if (e.value("cat", "") == "comm" && e["args"].contains("seq") && e["args"].contains("bytes") &&
          e["args"].contains("group"))
        ++comm_with_fields;
      memory = memory || e.value("name", "") == "memory";
    }
    // One per micro-batch and step, and one per validation batch: at steps 5, 10 and 12, 4 batches each.
    EXPECT_EQ(forward, 12 + 3 * 4);
    EXPECT_GT(comm_with_fields, 12);
    EXPECT_TRUE(memory);
    EXPECT_TRUE(clock);
  }
  expect_merged_timeline(merge(dir), 2);
}

// Item 6: with no train.peak_flops_per_rank, the denominator is measured at the model's GEMM shapes and printed,
// and MFU is the achieved rate over it.
TEST(Mfu, DenominatorIsTheMeasuredGemmPeakAtTheModelsShapes) {
  const std::string dir = fresh_dir("mfu-measured");
  auto args = tiny_args(dir, 1, 3);
  const auto peak = std::find(args.begin(), args.end(), "train.peak_flops_per_rank=1e9");
  ASSERT_NE(peak, args.end());
  args.erase(peak - 1, peak + 1);
  const ProcessResult r = run_process(args, {}, std::chrono::minutes(2));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(contains(r.output, "MFU peak per thread (fp32):")) << r.output;
  const auto rows = read_metrics(dir);
  ASSERT_EQ(rows.size(), 3u);
  for (const auto& row : rows) {
    const double gemm = row["gemm_peak_flops"].get<double>(), achieved = row["achieved_flops_per_rank"].get<double>();
    EXPECT_GT(gemm, 1e8) << "any CPU multiplies faster than 0.1 GFLOP/s: not measured?";
    EXPECT_NE(gemm, 1e9);
    EXPECT_NEAR(row["mfu"].get<double>(), achieved / gemm, 1e-12);
  }
}

TEST(Traces, PipelineAndTensorParallelRanksRecordStagesAndTransfers) {
  const std::string dir = fresh_dir("trace-pp2-tp2");
  auto args = tiny_args(dir, 4, 6);
  args.insert(args.end(), {"--set", "parallel.pp=2", "--set", "parallel.tp=2", "--set", "parallel.dp=1", "--set",
                           "train.micro_batches=4", "--set", "parallel.schedule=1f1b", "--set", "train.eval_every=0"});
  const ProcessResult r = run_process(args, {}, std::chrono::minutes(3));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    const auto events = read_trace(dir + "/traces/rank-" + std::to_string(rank) + ".json");
    const auto cats = categories(events);
    for (const char* kind : {"step", "compute", "p2p", "comm", "optimizer"})
      EXPECT_TRUE(cats.count(kind)) << "rank " << rank << " has no '" << kind << "' span";
    std::set<int> stages, microbatches;
    bool transfer_with_peer = false;
    for (const auto& e : events) {
      if (e.value("cat", "") == "compute" && e["args"].contains("stage")) {
        stages.insert(e["args"]["stage"].get<int>());
        microbatches.insert(e["args"]["mb"].get<int>());
      }
      transfer_with_peer = transfer_with_peer || (e.value("cat", "") == "p2p" && e["args"].contains("peer"));
    }
    EXPECT_EQ(stages.size(), 1u) << "rank " << rank << " runs one stage";
    EXPECT_EQ(microbatches.size(), 4u);
    EXPECT_TRUE(transfer_with_peer);
  }
  expect_merged_timeline(merge(dir), 4);
  // One replica: no gradient all-reduce, so all the communication the rows show is tensor- and pipeline-parallel.
  for (const auto& row : read_metrics(dir)) {
    EXPECT_GT(row["comm_time_s"].get<double>(), 0.0) << row.dump();
    EXPECT_GT(row["exposed_comm_time_s"].get<double>(), 0.0) << row.dump();
  }
}

TEST(Stragglers, SlowedRankIsNamedWithinTenSteps) {
  const std::string dir = fresh_dir("straggler-slow");
  auto args = tiny_args(dir, 2, 12);
  args.insert(args.end(), {"--set", "sync.slow_rank=1", "--set", "sync.slow_ms=60", "--set", "train.eval_every=0"});
  const ProcessResult r = run_process(args, {}, std::chrono::minutes(3));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(contains(r.output, "warning: straggler: rank 1 is busy")) << r.output;
  bool named_by_ten = false;
  for (const auto& row : read_metrics(dir))
    if (row["step"].get<int>() <= 10 && row.contains("straggler_rank") && row["straggler_rank"] == 1) {
      named_by_ten = true;
      EXPECT_GT(row["straggler_score"][1].get<double>(), 1.25);
      EXPECT_EQ(row["rank_busy_s"].size(), 2u);
    }
  EXPECT_TRUE(named_by_ten) << "no metrics row up to step 10 names rank 1";
}

TEST(HangDiagnosis, RankThatSkipsACollectiveIsNamedByTheOthersWithinTwoSecondsOfTheTimeout) {
  const std::string dir = fresh_dir("hang-skip");
  const double timeout_s = 3;
  auto args = tiny_args(dir, 2, 30);
  args.insert(args.end(), {"--set", "comm.timeout_s=" + std::to_string(timeout_s), "--set",
                           "debug.skip_collective=1@5", "--set", "train.eval_every=0", "--set", "run.log_every=1"});
  Process job(args);
  // Rank 1 holds back its first collective of step 5, right after step 4 ends.
  ASSERT_TRUE(job.wait_for_output("step 4/30", std::chrono::seconds(60))) << job.wait(std::chrono::seconds(1)).output;
  const auto held_back = Clock::now();
  ASSERT_TRUE(job.wait_for_output("hang diagnosis", std::chrono::seconds(30)));
  const double seconds = std::chrono::duration<double>(Clock::now() - held_back).count();
  const ProcessResult r = job.wait(std::chrono::seconds(30));
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.output, "[rank 0] crosstrain: error:")) << r.output;
  EXPECT_TRUE(contains(r.output, "rank 1 never reached it")) << r.output;
  EXPECT_TRUE(contains(r.output, "debug.skip_collective")) << "what rank 1 was doing: " << r.output;
  std::cout << "[ measure  ] the others' error named rank 1 " << seconds << " s after it held back (timeout "
            << timeout_s << " s)" << std::endl;
  // The step itself takes a few milliseconds; the rest is the timeout and the diagnosis.
  EXPECT_LT(seconds, timeout_s + 2) << r.output;
}

}  // namespace
}  // namespace crosstrain::testing
