// The recording side of observability without processes: the flight recorder and its diagnosis, the recording
// communicator over the in-process back end, straggler detection, trace lanes, spans and the trace writer.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ATen/ATen.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/diagnostics/flight_recorder.h"
#include "crosstrain/comm/diagnostics/recording.h"
#include "crosstrain/obs/straggler.h"
#include "crosstrain/obs/trace.h"

namespace crosstrain {
namespace {

using comm::FlightRecorder;
using comm::OpRecord;
using comm::OpState;
using comm::RankStatus;

OpRecord op(const char* name, int group, bool p2p = false) {
  OpRecord r;
  r.op = name;
  r.group = group;
  r.p2p = p2p;
  r.step = 3;
  return r;
}

TEST(FlightRecorder, NumbersCollectivesPerGroupAndPointToPointApart) {
  FlightRecorder rec(0, 8);
  const int world = rec.register_group("world", {0, 1});
  const int dp = rec.register_group("dp", {0, 2});
  EXPECT_EQ(rec.register_group("world", {0, 1}), world);
  EXPECT_EQ(rec.issue(op("all_reduce", world)).seq, 1);
  EXPECT_EQ(rec.issue(op("send", world, true)).seq, 1);
  EXPECT_EQ(rec.issue(op("all_reduce", world)).seq, 2);
  EXPECT_EQ(rec.issue(op("broadcast", dp)).seq, 1);
}

TEST(FlightRecorder, StatusShowsHowFarEachGroupGotAndWhatIsPending) {
  FlightRecorder rec(4, 8);
  const int g = rec.register_group("world", {0, 4});
  std::vector<OpRecord> finished;
  rec.set_sink([&](const OpRecord& r) { finished.push_back(r); });
  OpRecord a = rec.issue(op("all_reduce", g));
  OpRecord b = rec.issue(op("all_gather", g));
  rec.finish(a, OpState::Completed);
  rec.set_activity("optimizer");
  rec.set_step(9);
  const RankStatus s = rec.status();
  EXPECT_EQ(s.rank, 4);
  EXPECT_EQ(s.activity, "optimizer");
  EXPECT_EQ(s.step, 9);
  ASSERT_EQ(s.groups.size(), 1u);
  EXPECT_EQ(s.groups[0].issued, 2);
  EXPECT_EQ(s.groups[0].completed, 1);
  EXPECT_EQ(s.groups[0].last_op, "all_gather");
  ASSERT_EQ(s.pending.size(), 1u);
  EXPECT_EQ(s.pending[0].seq, b.seq);
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0].state, OpState::Completed);
}

TEST(FlightRecorder, KeepsOnlyTheLastRecords) {
  FlightRecorder rec(0, 3);
  const int g = rec.register_group("world", {0});
  for (int i = 0; i < 5; ++i) rec.finish(rec.issue(op("barrier", g)), OpState::Completed);
  const auto recent = rec.recent();
  ASSERT_EQ(recent.size(), 3u);
  EXPECT_EQ(recent.front().seq, 3);
  EXPECT_EQ(recent.back().seq, 5);
}

TEST(FlightRecorder, StatusSurvivesJson) {
  FlightRecorder rec(2, 4);
  const int g = rec.register_group("world/dp", {0, 2});
  rec.issue(op("recv", g, true));
  rec.set_activity("backward");
  const RankStatus back = comm::rank_status_from_json(comm::to_json(rec.status()));
  EXPECT_EQ(back.rank, 2);
  EXPECT_EQ(back.activity, "backward");
  ASSERT_EQ(back.groups.size(), 1u);
  EXPECT_EQ(back.groups[0].members, (std::vector<int>{0, 2}));
  ASSERT_EQ(back.pending.size(), 1u);
  EXPECT_STREQ(back.pending[0].op, "recv");
  EXPECT_EQ(back.pending_groups[0], "world/dp");
  EXPECT_THROW(comm::rank_status_from_json("{\"rank\": 1}"), Error);
}

RankStatus answer(int rank, int64_t issued, int64_t completed, const char* activity) {
  RankStatus s;
  s.rank = rank;
  s.activity = activity;
  s.step = 5;
  s.groups.push_back({"world", {0, 1, 2, 3}, issued, completed, "all_reduce", "completed"});
  return s;
}

TEST(HangDiagnosis, NamesWhoNeverReachedItWhoWaitsAndWhoIsSilent) {
  OpRecord stuck = op("all_reduce", 0);
  stuck.seq = 17;
  stuck.step = 5;
  const std::string text = comm::diagnose_hang(
      stuck, "world", {0, 1, 2, 3}, 0, {answer(0, 17, 16, "backward"), answer(1, 16, 16, "data"), answer(2, 17, 16, "backward")},
      1.5);
  EXPECT_NE(text.find("all_reduce #17 on group 'world' at step 5"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 never reached it (its last there: #16 all_reduce, completed; now in data at step 5)"),
            std::string::npos) << text;
  EXPECT_NE(text.find("rank 2 wait in it too"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 3 did not answer within 1.5 s"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 0"), std::string::npos) << "the asking rank is not a finding: " << text;
}

TEST(HangDiagnosis, PointToPointAsksTheOnePeer) {
  OpRecord stuck = op("recv", 0, true);
  stuck.seq = 4;
  stuck.peer = 1;  // group rank 1 = global rank 3
  RankStatus peer = answer(3, 2, 2, "forward");
  OpRecord pending = op("send", 0, true);
  pending.seq = 9;
  pending.peer = 0;
  peer.pending.push_back(pending);
  peer.pending_groups.push_back("pp");
  const std::string text = comm::diagnose_hang(stuck, "pp", {2, 3}, 2, {peer, answer(0, 1, 1, "x")}, 1.0);
  EXPECT_NE(text.find("peer rank 3 is in forward at step 5, with pending send #9 (peer 0)"), std::string::npos) << text;
  EXPECT_EQ(text.find("rank 0"), std::string::npos) << "only the peer is asked about: " << text;
}

TEST(HangDiagnosis, APeerThatFailedFirstIsNamedWithItsFailure) {
  FlightRecorder rec(2, 8);
  const int g = rec.register_group("world.g3", {2, 3});
  rec.finish(rec.issue(op("all_reduce", g)), OpState::Failed);
  const RankStatus peer = comm::rank_status_from_json(comm::to_json(rec.status()));
  OpRecord stuck = op("recv", 0, true);
  stuck.seq = 51;
  stuck.peer = 1;
  const std::string text = comm::diagnose_hang(stuck, "world.g0", {0, 2}, 0, {peer}, 1.0);
  EXPECT_NE(text.find("peer rank 2 failed in all_reduce #1 on 'world.g3'"), std::string::npos) << text;
}

TEST(HangDiagnosis, NamesWhatAPeerWaitsForInAnotherGroup) {
  OpRecord stuck = op("recv", 0, true);
  stuck.seq = 51;
  stuck.peer = 1;
  RankStatus peer = answer(2, 66, 66, "");
  OpRecord elsewhere = op("all_reduce", 0);
  elsewhere.seq = 67;
  peer.pending.push_back(elsewhere);
  peer.pending_groups.push_back("world.g3");
  const std::string text = comm::diagnose_hang(stuck, "world.g0", {0, 2}, 0, {peer}, 1.0);
  EXPECT_NE(text.find("peer rank 2 is waiting in all_reduce #67 on 'world.g3' at step 5, with nothing pending in "
                      "that group"),
            std::string::npos)
      << text;
}

// ---- the recording communicator over the in-process back end ----------------------------------------------

TEST(RecordingCommunicator, SameSequenceNumbersOnEveryRankAndBlockedTimeOfTheEarlyOne) {
  std::mutex mu;
  std::map<int, std::vector<OpRecord>> seen;
  std::map<int, double> blocked;
  comm::FakeWorld::run(3, [&](comm::Communicator& raw) {
    auto rec = std::make_shared<FlightRecorder>(raw.rank(), 16);
    std::vector<OpRecord> mine;
    rec->set_sink([&](const OpRecord& r) { mine.push_back(r); });
    comm::RecordingOptions o;
    o.recorder = rec;
    auto c = comm::make_recording(raw, o);
    auto sub = c->split({0, 2});
    at::Tensor t = at::ones({5});
    // Rank 2 arrives late: the others are blocked ~100 ms waiting for it.
    if (raw.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    c->all_reduce(t, comm::ReduceOp::Sum)->wait();
    if (sub) sub->broadcast(t, 0)->wait();
    c->barrier()->wait();
    std::lock_guard<std::mutex> lock(mu);
    seen[raw.rank()] = mine;
    blocked[raw.rank()] = rec->blocked_seconds();
    if (sub) EXPECT_EQ(rec->status().groups.at(1).members, (std::vector<int>{0, 2}));
  });
  for (int r = 0; r < 3; ++r) {
    const auto& ops = seen[r];
    ASSERT_EQ(ops.size(), r == 1 ? 2u : 3u) << "rank " << r;
    EXPECT_STREQ(ops.front().op, "all_reduce");
    EXPECT_EQ(ops.front().seq, 1);
    EXPECT_EQ(ops.front().bytes, 20);
    EXPECT_EQ(ops.back().seq, 2) << "the barrier is the world's second collective on every rank";
    EXPECT_EQ(ops.back().state, OpState::Completed);
    EXPECT_GE(ops.front().finished_us, ops.front().issued_us);
  }
  // Rank 2 arrives 100 ms late: the others wait most of that (allowing for threads that start late under load).
  EXPECT_GT(blocked[0], 0.04);
  EXPECT_GT(blocked[1], 0.04);
  EXPECT_LT(blocked[2], 0.06);
}

TEST(RecordingCommunicator, TimeoutIsRecordedAsFailed) {
  std::mutex mu;
  std::vector<OpRecord> failed;
  comm::FakeWorld::run(
      2,
      [&](comm::Communicator& raw) {
        auto rec = std::make_shared<FlightRecorder>(raw.rank(), 4);
        rec->set_sink([&](const OpRecord& r) {
          std::lock_guard<std::mutex> lock(mu);
          if (r.state == OpState::Failed) failed.push_back(r);
        });
        comm::RecordingOptions o;
        o.recorder = rec;
        auto c = comm::make_recording(raw, o);
        at::Tensor t = at::ones({1});
        if (raw.rank() == 0) EXPECT_THROW(c->all_reduce(t, comm::ReduceOp::Sum)->wait(), CommError);
      },
      comm::Millis(300));
  ASSERT_EQ(failed.size(), 1u);
  EXPECT_STREQ(failed[0].op, "all_reduce");
}

// ---- stragglers --------------------------------------------------------------------------------------------

TEST(StragglerDetector, NamesARankSlowerThanTheOthersForEnoughWindows) {
  obs::StragglerDetector d(0.25, 2);
  EXPECT_EQ(d.update({0.10, 0.16, 0.10, 0.11}).straggler, -1) << "one slow window is not enough";
  const auto v = d.update({0.10, 0.15, 0.10, 0.11});
  EXPECT_EQ(v.straggler, 1);
  EXPECT_TRUE(v.named_now);
  EXPECT_NEAR(v.scores[1], 0.15 / 0.10, 1e-9);
  EXPECT_FALSE(d.update({0.10, 0.15, 0.10, 0.11}).named_now) << "named once";
}

TEST(StragglerDetector, OneNormalWindowDoesNotClearIt) {
  obs::StragglerDetector d(0.25, 2);
  d.update({0.1, 0.2});
  d.update({0.1, 0.2});
  EXPECT_EQ(d.update({0.1, 0.11}).straggler, 1);
  const auto v = d.update({0.1, 0.1});
  EXPECT_EQ(v.straggler, -1);
  EXPECT_TRUE(v.cleared_now);
  EXPECT_EQ(v.previous, 1);
  EXPECT_NE(obs::straggler_warning(v, 11, 15).find("rank 1 is no longer slower"), std::string::npos);
}

TEST(StragglerDetector, NoiseBelowTheMarginAndASingleRankNameNobody) {
  obs::StragglerDetector d(0.25, 2);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(d.update({0.10 + 0.02 * (i % 2), 0.11, 0.10}).straggler, -1);
  obs::StragglerDetector alone(0.25, 1);
  EXPECT_EQ(alone.update({0.5}).straggler, -1);
}

TEST(StragglerDetector, PipelineStagesAreComparedWithinThemselves) {
  obs::StragglerDetector d(0.25, 1);
  // Ranks 0, 1: stage 0; ranks 2, 3: stage 1, whose work (the head and the loss) is heavier.
  EXPECT_EQ(d.update({0.10, 0.10, 0.20, 0.20}, {0, 0, 1, 1}).straggler, -1);
  const auto v = d.update({0.10, 0.10, 0.20, 0.30}, {0, 0, 1, 1});
  EXPECT_EQ(v.straggler, 3);
  EXPECT_NEAR(v.scores[3], 1.5, 1e-9);
  obs::StragglerDetector alone(0.25, 1);
  EXPECT_EQ(alone.update({0.1, 0.5}, {0, 1}).straggler, -1) << "a rank alone in its stage is compared with nobody";
}

TEST(StragglerDetector, ExcessBelowTheFloorIsNoise) {
  obs::StragglerDetector d(0.25, 1, 0.002);
  EXPECT_EQ(d.update({0.003, 0.0045}).straggler, -1) << "1.5x, but 1.5 ms a step";
  EXPECT_EQ(d.update({0.003, 0.0055}).straggler, 1);
  EXPECT_DOUBLE_EQ(obs::median_step({0.004, 0.1, 0.003, 0.005, 0.0035}), 0.004) << "one preempted step is ignored";
}

TEST(StragglerDetector, WarningNamesRankRatioAndSteps) {
  obs::StragglerDetector d(0.25, 1);
  const auto v = d.update({0.0318, 0.0610});
  EXPECT_EQ(obs::straggler_warning(v, 6, 10),
            "straggler: rank 1 is busy 1.92x the median of the others (61.0 ms vs 31.8 ms a step) over steps 6-10; "
            "every collective waits for it");
}

// ---- traces ------------------------------------------------------------------------------------------------

TEST(LaneAssigner, OverlappingSpansGetLanesOfTheirOwnAndFreedLanesAreReused) {
  obs::LaneAssigner lanes;
  EXPECT_EQ(lanes.place(0, 10), std::make_pair(0, true));
  EXPECT_EQ(lanes.place(5, 15), std::make_pair(1, true));
  EXPECT_EQ(lanes.place(10, 20), std::make_pair(0, false));
  EXPECT_EQ(lanes.place(12, 13), std::make_pair(2, true));
  EXPECT_EQ(lanes.place(16, 18), std::make_pair(1, false));
}

TEST(TraceFormat, SpanIsOneJsonEventWithItsArguments) {
  obs::Span s;
  s.kind = obs::SpanKind::Comm;
  s.name = "all_reduce";
  s.ts_us = 100;
  s.dur_us = 25;
  s.tid = 1001;
  s.step = 7;
  s.group = 0;
  s.seq = 3;
  s.bytes = 4096;
  s.state = "completed";
  const std::string line = obs::format_span(s, 2, {"world \"x\""});
  ASSERT_EQ(line.back(), ',');
  const auto j = nlohmann::json::parse(line.substr(0, line.size() - 1));
  EXPECT_EQ(j["ph"], "X");
  EXPECT_EQ(j["pid"], 2);
  EXPECT_EQ(j["tid"], 1001);
  EXPECT_EQ(j["cat"], "comm");
  EXPECT_EQ(j["args"]["group"], "world \"x\"");
  EXPECT_EQ(j["args"]["seq"], 3);
  EXPECT_EQ(j["args"]["bytes"], 4096);
  EXPECT_FALSE(j["args"].contains("mb"));
}

nlohmann::json read_array(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  return nlohmann::json::parse(text + "]");
}

TEST(Tracer, WritesMetadataSpansLanesAndMemoryAndKeepsTheNewestWhenFull) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / "tracer" / "rank-1.json").string();
  int64_t dropped_by_tracer = 0;
  std::filesystem::remove_all(std::filesystem::path(path).parent_path());
  {
    obs::TraceIdentity id;
    id.rank = 1;
    id.world_size = 2;
    id.offset_us = -42;
    obs::Tracer t(path, id, 1000);
    const int g = t.group("world");
    for (int i = 0; i < 1500; ++i) {
      obs::Tracer::Scope scope(&t, obs::SpanKind::Compute, "forward", i, 0);
    }
    obs::Span a;
    a.kind = obs::SpanKind::Comm;
    a.name = "all_reduce";
    a.group = g;
    a.ts_us = 10;
    a.dur_us = 10;
    obs::Span b = a;
    b.ts_us = 15;
    t.add(a);
    t.add(b);
    t.flush({123, 456, 789});
    dropped_by_tracer = t.dropped();
  }
  const auto events = read_array(path);
  int forward = 0, comm_lanes = 0, memory = 0, dropped = 0;
  int64_t first_step = -1;
  bool clock = false;
  for (const auto& e : events) {
    if (e["name"] == "crosstrain_clock") clock = e["args"]["offset_us"] == -42;
    if (e["name"] == "forward") {
      if (first_step < 0) first_step = e["args"]["step"];
      ++forward;
    }
    if (e["name"] == "thread_name" && e["tid"].get<int>() >= 1000) ++comm_lanes;
    if (e["name"] == "memory") memory = e["args"]["rss_bytes"];
    if (e["name"] == "dropped_events") dropped = e["args"]["count"];
  }
  EXPECT_TRUE(clock);
  EXPECT_GT(dropped_by_tracer, 0);
  EXPECT_LE(forward, 1000) << "the buffer holds at most its capacity";
  EXPECT_EQ(forward + dropped_by_tracer, 1500) << "every span is written or counted as dropped";
  EXPECT_EQ(first_step, dropped_by_tracer) << "the oldest spans go first";
  EXPECT_EQ(comm_lanes, 2) << "two overlapping collectives: two lanes";
  EXPECT_EQ(memory, 123);
  EXPECT_EQ(dropped, dropped_by_tracer);
}

}  // namespace
}  // namespace crosstrain
