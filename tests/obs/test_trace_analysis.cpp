// The figures of the run report from hand-made events, with the answers worked out by hand in the comments.
#include <gtest/gtest.h>

#include "crosstrain/obs/trace_analysis.h"
#include "synthetic_run.h"

using namespace crosstrain::obs;
using crosstrain::testing::clock_event;
using crosstrain::testing::memory_event;
using crosstrain::testing::span;

namespace {

std::string show(const Intervals& spans) {
  std::string text;
  for (const auto& s : spans) text += "[" + std::to_string(int(s.begin)) + "," + std::to_string(int(s.end)) + ")";
  return text;
}

const RankTimes& rank_of(const TraceAnalysis& analysis, int rank) {
  for (const auto& r : analysis.ranks)
    if (r.rank == rank) return r;
  throw std::runtime_error("no rank " + std::to_string(rank));
}

}  // namespace

TEST(Intervals, MergeIntersectSubtract) {
  EXPECT_EQ(show(merged({{5, 7}, {0, 2}, {1, 3}, {3, 4}, {9, 9}})), "[0,4)[5,7)");
  EXPECT_EQ(show(intersection({{0, 10}, {20, 30}}, {{5, 25}, {28, 40}})), "[5,10)[20,25)[28,30)");
  EXPECT_EQ(show(difference({{0, 10}, {20, 30}}, {{2, 3}, {5, 22}, {29, 35}})), "[0,2)[3,5)[22,29)");
  EXPECT_EQ(show(difference({{0, 10}}, {})), "[0,10)");
  EXPECT_DOUBLE_EQ(total_length({{0, 4}, {5, 7}}), 6);
}

// Rank 0, two steps of 100 us:
//   step 1 [0,100): forward [10,40), backward [40,80) with a wait [60,70) inside, optimizer [80,90), wait [90,95)
//   step 2 [100,200): forward [100,150), wait [150,160), backward [160,190)
//   lanes: all_reduce [50,75) on tid 1 and [65,96) on tid 2, [140,170) on tid 1
// compute = (80 - 10) + (50 + 30) = 150; exposed = 10 + 5 + 10 = 25; idle = 200 - 150 - 25 = 25
// comm = [50,96) + [140,170) = 46 + 30 = 76; overlap = 1 - 25/76
// Rank 1: steps [0,100), [100,200), compute [0,90), [100,190), no communication; a forward at [250,260) lies outside
// the steps (an evaluation) and does not count: compute 180, exposed 0, idle 20.
TEST(TraceAnalysis, ComputeExposedIdleAndOverlapPerRank) {
  nlohmann::json events = nlohmann::json::array(
      {clock_event(0, 0), span(0, 0, "step", "step", 0, 100), span(0, 0, "forward", "compute", 10, 30),
       span(0, 0, "backward", "compute", 40, 40), span(0, 0, "wait", "wait", 60, 10),
       span(0, 0, "optimizer", "optimizer", 80, 10), span(0, 0, "wait", "wait", 90, 5),
       span(0, 1, "all_reduce", "comm", 50, 25), span(0, 2, "all_reduce", "comm", 65, 31),
       span(0, 0, "step", "step", 100, 100), span(0, 0, "forward", "compute", 100, 50),
       span(0, 0, "wait", "wait", 150, 10), span(0, 0, "backward", "compute", 160, 30),
       span(0, 1, "all_reduce", "comm", 140, 30), memory_event(0, 50, 100), memory_event(0, 150, 200),
       span(1, 0, "step", "step", 0, 100), span(1, 0, "forward", "compute", 0, 90),
       span(1, 0, "step", "step", 100, 100), span(1, 0, "forward", "compute", 100, 90),
       span(1, 0, "forward", "compute", 250, 10)});
  const TraceAnalysis a = analyze_trace(events);
  ASSERT_EQ(a.ranks.size(), 2u);
  const RankTimes& r0 = rank_of(a, 0);
  EXPECT_EQ(r0.steps, 2);
  EXPECT_DOUBLE_EQ(r0.step_us, 200);
  EXPECT_DOUBLE_EQ(r0.compute_us, 150);
  EXPECT_DOUBLE_EQ(r0.exposed_us, 25);
  EXPECT_DOUBLE_EQ(r0.idle_us, 25);
  EXPECT_DOUBLE_EQ(r0.comm_us, 76);
  EXPECT_DOUBLE_EQ(r0.overlap, 1 - 25.0 / 76);
  EXPECT_DOUBLE_EQ(r0.bubble, -1);  // pp = 1
  EXPECT_EQ(r0.dp_index, 0);
  EXPECT_TRUE(r0.has_memory);
  EXPECT_DOUBLE_EQ(r0.rss_bytes, 200);  // the last counter, not the first
  EXPECT_DOUBLE_EQ(r0.peak_rss_bytes, 300);
  const RankTimes& r1 = rank_of(a, 1);
  EXPECT_DOUBLE_EQ(r1.compute_us, 180);
  EXPECT_DOUBLE_EQ(r1.exposed_us, 0);
  EXPECT_DOUBLE_EQ(r1.idle_us, 20);
  EXPECT_DOUBLE_EQ(r1.overlap, -1);
  EXPECT_FALSE(r1.has_memory);
  // Job: 1 - 25 / 76 (rank 1 has no communication).
  EXPECT_DOUBLE_EQ(a.overlap, 1 - 25.0 / 76);
  // Busy per step: rank 0 (200 - 25) / 2 = 87.5, rank 1 100; median 93.75.
  EXPECT_DOUBLE_EQ(r0.busy_per_step_us, 87.5);
  EXPECT_DOUBLE_EQ(a.median_busy_per_step_us, 93.75);
  EXPECT_DOUBLE_EQ(r1.straggler_ratio, 100 / 93.75);
  EXPECT_EQ(a.busiest_rank, 1);
  EXPECT_EQ(a.straggler_rank, -1);  // 1.067 is within the 25% margin
}

// Three ranks busy 100, 100 and 200 us per step: median 100, rank 2 at 2x is the straggler. The others wait for it
// (exposed), which is not busy time.
TEST(TraceAnalysis, StragglerTable) {
  nlohmann::json events = nlohmann::json::array();
  for (int rank = 0; rank < 3; ++rank) {
    for (int step = 0; step < 2; ++step) {
      const double t = step * 200.0;
      const double busy = rank == 2 ? 200 : 100;
      events.push_back(span(rank, 0, "step", "step", t, 200));
      events.push_back(span(rank, 0, "forward", "compute", t, busy));
      if (busy < 200) events.push_back(span(rank, 0, "wait", "wait", t + busy, 200 - busy));
    }
  }
  const TraceAnalysis a = analyze_trace(events);
  EXPECT_DOUBLE_EQ(a.median_busy_per_step_us, 100);
  EXPECT_DOUBLE_EQ(rank_of(a, 0).straggler_ratio, 1);
  EXPECT_DOUBLE_EQ(rank_of(a, 2).straggler_ratio, 2);
  EXPECT_EQ(a.straggler_rank, 2);
  EXPECT_EQ(analyze_trace(events, 1.5).straggler_rank, -1);  // a wider margin: no straggler
}

// Pipeline (pp = 2), stage 0: step [0,100): forward [0,30), recv_grad [30,50) (the wait for stage 1's gradient),
// backward [50,90), and a send on a lane. compute 70, exposed 20, idle 10, bubble 1 - 70/100 = 0.3.
// Stage 1: step [0,100): recv_activation [0,30), forward [30,50), backward [50,90): bubble 1 - 60/100 = 0.4.
TEST(TraceAnalysis, PipelineBubbleFromReceivesOnTheMainThread) {
  nlohmann::json events = nlohmann::json::array(
      {clock_event(0, 0, 2), clock_event(1, 0, 2), span(0, 0, "step", "step", 0, 100),
       span(0, 0, "forward", "compute", 0, 30), span(0, 0, "recv_grad", "p2p", 30, 20),
       span(0, 0, "backward", "compute", 50, 40), span(0, 0, "send_activation", "p2p", 30, 1),
       span(0, 1, "send", "comm", 30, 5), span(1, 0, "step", "step", 0, 100),
       span(1, 0, "recv_activation", "p2p", 0, 30), span(1, 0, "forward", "compute", 30, 20),
       span(1, 0, "backward", "compute", 50, 40)});
  const TraceAnalysis a = analyze_trace(events);
  EXPECT_EQ(a.pp, 2);
  EXPECT_DOUBLE_EQ(rank_of(a, 0).compute_us, 70);
  EXPECT_DOUBLE_EQ(rank_of(a, 0).exposed_us, 20);
  EXPECT_DOUBLE_EQ(rank_of(a, 0).idle_us, 10);
  EXPECT_DOUBLE_EQ(rank_of(a, 0).bubble, 0.3);
  EXPECT_DOUBLE_EQ(rank_of(a, 1).bubble, 0.4);
  EXPECT_EQ(rank_of(a, 1).pp_index, 1);
  EXPECT_DOUBLE_EQ(a.bubble, 0.35);
}

TEST(TraceAnalysis, DroppedEventsAndNoSteps) {
  nlohmann::json events = nlohmann::json::array(
      {{{"ph", "C"}, {"pid", 0}, {"name", "dropped_events"}, {"ts", 1}, {"args", {{"count", 12}}}},
       {{"ph", "C"}, {"pid", 0}, {"name", "dropped_events"}, {"ts", 2}, {"args", {{"count", 30}}}}});
  const TraceAnalysis a = analyze_trace(events);
  ASSERT_EQ(a.ranks.size(), 1u);
  EXPECT_EQ(a.ranks[0].dropped_events, 42);  // each append writes the count it dropped since the last
  EXPECT_EQ(a.ranks[0].steps, 0);
  EXPECT_EQ(a.busiest_rank, -1);
  EXPECT_DOUBLE_EQ(a.overlap, -1);
}
