// The discrete-event replay (planner/simulate.h) on hand-built StepModels; every expected time is derived in a
// comment from the rules in the header.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/simulate.h"

namespace crosstrain::planner {
namespace {

using parallel::Action;
using parallel::ActionType;
using parallel::ScheduleKind;
using parallel::ScheduleSpec;

constexpr double kInf = std::numeric_limits<double>::infinity();

comm::Link free_link() {
  comm::Link link;
  link.latency_s = 0;
  link.bandwidth_Bps = kInf;
  return link;
}

// A link on which one boundary message alone takes `seconds` (no latency: every second is bandwidth).
comm::Link link_taking(double seconds, double bytes) {
  comm::Link link;
  link.latency_s = 0;
  link.bandwidth_Bps = bytes / seconds;
  return link;
}

// Unit costs as parallel::SimulationCosts' defaults: f = 1, b = 2 (b_input = b_weight = 1), free messages.
StepModel unit_model(ScheduleSpec spec) {
  StepModel model;
  model.schedule = spec;
  const int stages = spec.stages * spec.chunks;
  model.stages.assign(stages, StageCosts{1, 2, 1, 1, 0});
  model.boundary_link.assign(stages - 1, free_link());
  model.boundary_bytes = 1e6;
  return model;
}

// Every message of the model takes `c` seconds on its own link (resource -1 unless given).
StepModel with_transfer(StepModel model, double c, int resource = -1) {
  for (comm::Link& link : model.boundary_link) link = link_taking(c, model.boundary_bytes);
  model.boundary_resource.assign(model.boundary_link.size(), resource);
  return model;
}

const SimulatedSpan* find_span(const SimulationReport& r, int rank, const std::string& name) {
  for (const SimulatedSpan& s : r.spans)
    if (s.pp_rank == rank && s.name == name) return &s;
  return nullptr;
}

// With free messages and unit costs the replay is parallel::simulate: same lists, same rules.
TEST(Simulate, FreeCommunicationReproducesScheduleMakespan) {
  const ScheduleSpec specs[] = {
      {ScheduleKind::GPipe, 4, 8},          {ScheduleKind::GPipe, 3, 1},
      {ScheduleKind::OneFOneB, 4, 8},       {ScheduleKind::OneFOneB, 3, 5},
      {ScheduleKind::OneFOneB, 1, 3},       {ScheduleKind::Interleaved1F1B, 4, 8, 2},
      {ScheduleKind::Interleaved1F1B, 2, 4, 3}, {ScheduleKind::ZeroBubbleH1, 4, 8},
      {ScheduleKind::ZeroBubbleH1, 3, 2},   {ScheduleKind::ZeroBubbleH2, 4, 8},
      {ScheduleKind::ZeroBubbleH2, 5, 12},
  };
  for (const ScheduleSpec& spec : specs) {
    SCOPED_TRACE(std::string(parallel::to_string(spec.kind)) + " p=" + std::to_string(spec.stages) +
                 " m=" + std::to_string(spec.microbatches) + " v=" + std::to_string(spec.chunks));
    const auto actions = parallel::build_schedule(spec);
    const double expected = parallel::simulate(spec, actions).makespan;
    const SimulationReport r = simulate_step(unit_model(spec));
    EXPECT_NEAR(r.step_s, expected, 1e-9);
    // Each rank computes m*v micro-batch chunks at f + b = 3 each.
    for (double busy : r.busy_s) EXPECT_NEAR(busy, 3.0 * spec.microbatches * spec.chunks, 1e-9);
    EXPECT_EQ(r.pp_transfer_s, 0);
  }
}

// The cost of each action comes from its own virtual stage: GPipe p=2, m=1 runs F(s0) F(s1) B(s1) B(s0) in a row,
// 1 + 100 + 1000 + 10 = 1111; swapping stages or forward/backward would give another sum.
TEST(Simulate, EachActionUsesItsVirtualStageCost) {
  StepModel model = unit_model({ScheduleKind::GPipe, 2, 1});
  model.stages[0] = {1, 10, 0, 0, 0};
  model.stages[1] = {100, 1000, 0, 0, 0};
  const SimulationReport r = simulate_step(model);
  EXPECT_DOUBLE_EQ(r.step_s, 1111);
  EXPECT_DOUBLE_EQ(r.busy_s[0], 11);
  EXPECT_DOUBLE_EQ(r.busy_s[1], 1100);
  // Rank 0 idles 1100 s waiting for the gradient (bubble, the message was free): no exposed transfer.
  EXPECT_DOUBLE_EQ(r.recv_wait_s[0], 1100);
  EXPECT_DOUBLE_EQ(r.pp_transfer_s, 0);
}

// Zero bubble splits the backward: ZB-H1 with one rank and one micro-batch runs F, Bi, Bw = 1 + 20 + 300; the
// full backward_s (4000) is never used.
TEST(Simulate, ZeroBubbleUsesInputAndWeightCosts) {
  StepModel model = unit_model({ScheduleKind::ZeroBubbleH1, 1, 1});
  model.stages[0] = {1, 4000, 20, 300, 0};
  const SimulationReport r = simulate_step(model);
  EXPECT_DOUBLE_EQ(r.step_s, 321);
  ASSERT_NE(find_span(r, 0, "Bi mb0 c0"), nullptr);
  EXPECT_DOUBLE_EQ(find_span(r, 0, "Bw mb0 c0")->start_s, 21);
}

// 1F1B, f = 1, b = 2, every message c = 0.25 s on a private link.
//  p=2, m=1: F0 [0,1], act c, F1 [1.25,2.25], B1 [2.25,4.25], grad c, B0 [4.5,6.5]: 6 + 2c = 6.5.
//  p=4, m=1: the micro-batch crosses 3 boundaries forward and 3 back: 4 * 3 + 6c = 13.5.
//  p=2, m=2: rank 0 F0 [0,1], F1 [1,2] (a1 sent at 2, arrives 2+c); rank 1 F0 [1+c,2+c], B0 [2+c,4+c] (g0
//  arrives 4+2c), F1 [4+c,5+c] (a1 is there), B1 [5+c,7+c] (g1 arrives 7+2c); rank 0 B0 [4+2c,6+2c],
//  B1 [7+2c,9+2c]: 9 + 2c = 9.5. Rank 0 is critical; it waited for g0 from 2 to 4.5 (sent at 4.25: c exposed)
//  and for g1 from 6.5 to 7.5 (sent at 7.25: c exposed), so pp_transfer_s = 2c.
TEST(Simulate, TransferLatencyOnOneFOneB) {
  const double c = 0.25;
  EXPECT_DOUBLE_EQ(simulate_step(with_transfer(unit_model({ScheduleKind::OneFOneB, 2, 1}), c)).step_s, 6 + 2 * c);
  EXPECT_DOUBLE_EQ(simulate_step(with_transfer(unit_model({ScheduleKind::OneFOneB, 4, 1}), c)).step_s,
                   12 + 6 * c);
  const SimulationReport r = simulate_step(with_transfer(unit_model({ScheduleKind::OneFOneB, 2, 2}), c));
  EXPECT_DOUBLE_EQ(r.step_s, 9 + 2 * c);
  EXPECT_EQ(r.critical_rank, 0);
  EXPECT_DOUBLE_EQ(r.recv_wait_s[0], 2.5 + 1);
  EXPECT_DOUBLE_EQ(r.pp_transfer_s, 2 * c);
  // The transfer spans sit on the sender's track from the send to the arrival.
  const SimulatedSpan* grad = find_span(r, 1, "send grad mb0 c0");
  ASSERT_NE(grad, nullptr);
  EXPECT_EQ(grad->category, "transfer");
  EXPECT_DOUBLE_EQ(grad->start_s, 2 + c + 2);
  EXPECT_DOUBLE_EQ(grad->end_s, 4 + 2 * c);
}

// Each message crosses its own boundary's link in both directions: GPipe p=3 m=1 with boundary 0 taking 0.1 s
// and boundary 1 0.01 s: 3 forwards + 3 backwards = 9, plus 0.1 + 0.01 forward and 0.01 + 0.1 back: 9.22.
TEST(Simulate, MessagesUseTheLinkOfTheBoundaryTheyCross) {
  StepModel model = with_transfer(unit_model({ScheduleKind::GPipe, 3, 1}), 0.1);
  model.boundary_link[1] = link_taking(0.01, model.boundary_bytes);
  const SimulationReport r = simulate_step(model);
  EXPECT_NEAR(r.step_s, 9.22, 1e-12);
  const SimulatedSpan* grad = find_span(r, 2, "send grad mb0 c0");  // stage 2 -> 1 crosses boundary 1
  EXPECT_NEAR(grad->end_s - grad->start_s, 0.01, 1e-12);
}

// An independent reference for private links: every message arrives a fixed time after its send (the link's
// seconds for the boundary it crosses), so each rank's clock is a plain max-plus replay of its list.
double constant_delay_makespan(const StepModel& model) {
  const ScheduleSpec& spec = model.schedule;
  const auto lists = parallel::build_schedule(spec);
  const int p = spec.stages, stages = p * spec.chunks;
  std::vector<double> arrival(2 * stages * spec.microbatches, -1);  // [kind][receiving stage][mb]
  auto slot = [&](bool activation, int stage, int mb) -> double& {
    return arrival[((activation ? 0 : 1) * stages + stage) * spec.microbatches + mb];
  };
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      for (; pc[r] < lists[r].size(); ++pc[r], moved = true) {
        const Action& a = lists[r][pc[r]];
        const int s = parallel::virtual_stage(spec, r, a.chunk);
        const StageCosts& c = model.stages[s];
        if (a.type == ActionType::Forward) clock[r] += c.forward_s;
        if (a.type == ActionType::Backward) clock[r] += c.backward_s;
        if (a.type == ActionType::BackwardInput) clock[r] += c.backward_input_s;
        if (a.type == ActionType::BackwardWeight) clock[r] += c.backward_weight_s;
        if (a.type == ActionType::SendActivation)
          slot(true, s + 1, a.microbatch) = clock[r] + model.boundary_link[s].seconds(model.boundary_bytes);
        if (a.type == ActionType::SendGrad)
          slot(false, s - 1, a.microbatch) = clock[r] + model.boundary_link[s - 1].seconds(model.boundary_bytes);
        if (a.type == ActionType::RecvActivation || a.type == ActionType::RecvGrad) {
          const double t = slot(a.type == ActionType::RecvActivation, s, a.microbatch);
          if (t < 0) break;
          clock[r] = std::max(clock[r], t);
        }
      }
    }
  }
  return *std::max_element(clock.begin(), clock.end());
}

// On private links no flow slows another, so the event loop must agree with the constant-delay reference on
// every schedule, with many messages in flight at once (different links per boundary, latency and bandwidth).
TEST(Simulate, PrivateLinksMatchConstantDelayReference) {
  const ScheduleSpec specs[] = {
      {ScheduleKind::GPipe, 4, 8},       {ScheduleKind::OneFOneB, 6, 24},     {ScheduleKind::Interleaved1F1B, 4, 8, 3},
      {ScheduleKind::ZeroBubbleH1, 5, 10}, {ScheduleKind::ZeroBubbleH2, 4, 16},
  };
  for (const ScheduleSpec& spec : specs) {
    SCOPED_TRACE(parallel::to_string(spec.kind));
    StepModel model = unit_model(spec);
    for (size_t s = 0; s < model.stages.size(); ++s)
      model.stages[s] = {1.0 + 0.1 * s, 2.0 + 0.3 * s, 1.2 + 0.1 * s, 0.8 + 0.2 * s, 0};
    for (size_t b = 0; b < model.boundary_link.size(); ++b) {
      model.boundary_link[b].latency_s = 0.05 * (b % 3);
      model.boundary_link[b].bandwidth_Bps = model.boundary_bytes / (0.3 + 0.2 * b);
    }
    const double expected = constant_delay_makespan(model);
    EXPECT_NEAR(simulate_step(model).step_s, expected, 1e-9 * expected);
    // The same resource id on every boundary can only slow the step down.
    model.boundary_resource.assign(model.boundary_link.size(), 0);
    EXPECT_GE(simulate_step(model).step_s, expected - 1e-9);
  }
}

// Latency is paid once per message, whatever the size: a link of 0.5 s latency and 1 s for the bytes makes each
// message 1.5 s; 1F1B p=2 m=1 then takes 6 + 2 * 1.5 = 9.
TEST(Simulate, LatencyAddsToBandwidthTime) {
  StepModel model = unit_model({ScheduleKind::OneFOneB, 2, 1});
  model.boundary_link[0].latency_s = 0.5;
  model.boundary_link[0].bandwidth_Bps = model.boundary_bytes / 1.0;
  EXPECT_DOUBLE_EQ(simulate_step(model).step_s, 9);
}

// GPipe p=2 m=2 with a free stage-0 forward: rank 0 sends both activations at t = 0. Each alone takes c = 1.
//  private links (resource -1): a0, a1 arrive at 1; rank 1 F0 [1,2], F1 [2,3], B0 [3,5] (g0 [5,6]),
//  B1 [5,7] (g1 [7,8]); rank 0 B0 [6,8], B1 [8,10]: 10.
//  one shared resource: a0 and a1 share the link from 0 and both arrive at 2 (twice one); then everything is 1
//  later (g0 [6,7] and g1 [8,9] never overlap): 11.
TEST(Simulate, FlowsOnOneResourceShareItsBandwidth) {
  StepModel model = unit_model({ScheduleKind::GPipe, 2, 2});
  model.stages[0].forward_s = 0;
  const SimulationReport alone = simulate_step(with_transfer(model, 1.0, -1));
  const SimulationReport shared = simulate_step(with_transfer(model, 1.0, 7));
  EXPECT_DOUBLE_EQ(alone.step_s, 10);
  EXPECT_DOUBLE_EQ(shared.step_s, 11);
  for (const char* name : {"send act mb0 c0", "send act mb1 c0"}) {
    EXPECT_DOUBLE_EQ(find_span(alone, 0, name)->end_s - find_span(alone, 0, name)->start_s, 1) << name;
    EXPECT_DOUBLE_EQ(find_span(shared, 0, name)->end_s - find_span(shared, 0, name)->start_s, 2) << name;
  }
}

// Shares are recomputed when a flow joins and when one leaves. Hand-written lists, p = 3: rank 0 sends on
// boundary 0 at t = 0; rank 1 computes 1 s, then sends on boundary 1, then receives rank 0's message; rank 2
// receives rank 1's. Each message alone takes 2 s; both boundaries are one resource.
//  A alone [0,1] (1 s of work left), shared [1,3] at half rate: arrives at 3.
//  B shared [1,3] (1 s done), alone [3,4]: arrives at 4. Step = 4; with separate resources A = 2, B = 3.
TEST(Simulate, SharesChangeWhenFlowsStartAndEnd) {
  StepModel model = unit_model({ScheduleKind::OneFOneB, 3, 1});
  const std::vector<std::vector<Action>> lists = {
      {{ActionType::SendActivation, 0, 0}},
      {{ActionType::Forward, 0, 0}, {ActionType::SendActivation, 0, 0}, {ActionType::RecvActivation, 0, 0}},
      {{ActionType::RecvActivation, 0, 0}},
  };
  StepModel shared = with_transfer(model, 2.0, 0);
  const SimulationReport r = simulate_step(shared, lists);
  EXPECT_DOUBLE_EQ(find_span(r, 0, "send act mb0 c0")->end_s, 3);
  EXPECT_DOUBLE_EQ(find_span(r, 1, "send act mb0 c0")->end_s, 4);
  EXPECT_DOUBLE_EQ(r.step_s, 4);
  shared.boundary_resource = {0, 1};
  const SimulationReport separate = simulate_step(shared, lists);
  EXPECT_DOUBLE_EQ(find_span(separate, 0, "send act mb0 c0")->end_s, 2);
  EXPECT_DOUBLE_EQ(separate.step_s, 3);
}

// 1F1B p=2 m=1, unit costs, free messages: rank 0 ends its backward at 6, rank 1 at 4.
//  dp = {1, 6}, optimizer = {0.5, 0.25}, no overlap: rank 0 6 + 1 + 0.5 = 7.5, rank 1 4 + 6 + 0.25 = 10.25.
//  overlap 0.5: rank 0 6 + 0.5 + 0.5 = 7, rank 1 4 + 3 + 0.25 = 7.25; wan 2 more on top: 9.25.
TEST(Simulate, DataParallelSyncOptimizerAndWanAddToTheEnd) {
  StepModel model = unit_model({ScheduleKind::OneFOneB, 2, 1});
  model.dp_sync_s = {1, 6};
  model.dp_bytes = {1e6, 1e6};
  model.optimizer_s = {0.5, 0.25};
  SimulationReport r = simulate_step(model);
  EXPECT_DOUBLE_EQ(r.step_s, 10.25);
  EXPECT_EQ(r.critical_rank, 1);
  const SimulatedSpan* dp = find_span(r, 1, "dp sync");
  ASSERT_NE(dp, nullptr);
  EXPECT_DOUBLE_EQ(dp->start_s, 4);
  EXPECT_DOUBLE_EQ(dp->end_s, 10);
  EXPECT_DOUBLE_EQ(find_span(r, 1, "optimizer")->end_s, 10.25);

  // Overlap hides at most one micro-batch's backward (b = 2 here): rank 1 shows 6 - 0.5 x min(6, 2) = 5 s of its
  // sync, from 4 to 9, then the optimizer to 9.25.
  model.dp_overlap = 0.5;
  EXPECT_DOUBLE_EQ(simulate_step(model).step_s, 9.25);
  model.wan_s_per_step = 2;
  r = simulate_step(model);
  EXPECT_DOUBLE_EQ(r.step_s, 11.25);
  for (int rank : {0, 1}) {
    const SimulatedSpan* wan = find_span(r, rank, "wan exchange");
    ASSERT_NE(wan, nullptr);
    EXPECT_DOUBLE_EQ(wan->start_s, 9.25);
    EXPECT_DOUBLE_EQ(wan->end_s, 11.25);
  }
}

// The trace parses, holds one "X" event per compute action (1F1B p=2 m=3: 2 * 3 per rank) in microseconds on
// the rank's tid, names every rank's track, and spans come in start order.
TEST(Simulate, PerfettoTraceHoldsEveryComputeAction) {
  const SimulationReport r = simulate_step(with_transfer(unit_model({ScheduleKind::OneFOneB, 2, 3}), 0.5));
  const nlohmann::json trace = nlohmann::json::parse(r.perfetto_json);
  int compute = 0, transfers = 0;
  bool named[2] = {false, false};
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name" && e.at("tid").get<int>() < 2)
      named[e.at("tid").get<int>()] = e.at("args").at("name") == "pp rank " + std::to_string(e.at("tid").get<int>());
    if (e.at("ph") != "X") continue;
    EXPECT_EQ(e.at("pid"), 0);
    if (e.at("cat") == "transfer") ++transfers;
    if (e.at("cat") != "compute") continue;
    ++compute;
    if (e.at("name") == "B mb0 c0" && e.at("tid") == 1) {  // rank 1: F0 at [1.5, 2.5], B0 at [2.5, 4.5]
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 2.5e6);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 2e6);
    }
  }
  EXPECT_EQ(compute, 12);
  EXPECT_EQ(transfers, 6);  // 3 activations, 3 gradients
  EXPECT_TRUE(named[0] && named[1]);
  for (size_t i = 1; i < r.spans.size(); ++i) EXPECT_LE(r.spans[i - 1].start_s, r.spans[i].start_s);

  SimulationOptions quiet;
  quiet.trace = false;
  const SimulationReport untraced = simulate_step(unit_model({ScheduleKind::OneFOneB, 2, 3}), quiet);
  EXPECT_TRUE(untraced.spans.empty());
  EXPECT_TRUE(untraced.perfetto_json.empty());
}

void expect_usage_error(const StepModel& model, const std::string& field) {
  try {
    simulate_step(model);
    ADD_FAILURE() << "no error for a bad " << field;
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Simulate, BadSizesNameTheField) {
  const StepModel good = unit_model({ScheduleKind::Interleaved1F1B, 2, 4, 2});  // 4 virtual stages
  EXPECT_NO_THROW(simulate_step(good));
  StepModel m = good;
  m.stages.pop_back();
  expect_usage_error(m, "StepModel.stages has 3 entries");
  m = good;
  m.boundary_link.push_back(free_link());
  expect_usage_error(m, "boundary_link");
  m = good;
  m.boundary_resource = {0, 0};
  expect_usage_error(m, "boundary_resource");
  m = good;
  m.dp_sync_s = {1};
  expect_usage_error(m, "dp_sync_s");
  m = good;
  m.optimizer_s = {1, 1, 1};
  expect_usage_error(m, "optimizer_s");
  m = good;
  m.dp_bytes = {1};
  expect_usage_error(m, "dp_bytes");
  m = good;
  m.dp_overlap = 1.5;
  expect_usage_error(m, "dp_overlap");
  m = good;
  m.stages[2].backward_s = -1;
  expect_usage_error(m, "stages[2].backward_s");
  m = good;
  m.schedule.microbatches = 3;  // interleaved needs a multiple of the stages
  expect_usage_error(m, "multiple of stages");
}

// Rank 1 waits for a gradient rank 0 never sends: a deadlock names the blocked rank and the receive.
TEST(Simulate, DeadlockNamesTheBlockedRanks) {
  const StepModel model = unit_model({ScheduleKind::OneFOneB, 2, 1});
  const std::vector<std::vector<Action>> lists = {
      {{ActionType::Forward, 0, 0}},
      {{ActionType::RecvActivation, 0, 0}, {ActionType::Forward, 0, 0}},
  };
  try {
    simulate_step(model, lists);
    FAIL() << "no deadlock reported";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
    EXPECT_NE(what.find("rank 1 waits at action 0 (RecvActivation(mb 0, chunk 0) from rank 0"),
              std::string::npos)
        << what;
  }
}

// The planner replays large pipelines: p = 16, m = 192 with shared transfers stays well inside a second (the
// target is under 100 ms; the bound here leaves room for a loaded machine). 1F1B with messages of c on one
// resource per boundary still finishes, and each rank computes m * 3.
TEST(Simulate, LargePipelineIsFast) {
  StepModel model = with_transfer(unit_model({ScheduleKind::OneFOneB, 16, 192}), 0.1);
  for (size_t b = 0; b < model.boundary_resource.size(); ++b) model.boundary_resource[b] = static_cast<int>(b);
  const auto start = std::chrono::steady_clock::now();
  const SimulationReport r = simulate_step(model);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 1.0);
  // At least the unit-cost makespan (m + p - 1) * 3, plus 2 (p - 1) transfers on the first micro-batch's path.
  EXPECT_GE(r.step_s, (192 + 15) * 3 + 30 * 0.1 - 1e-9);
  for (double busy : r.busy_s) EXPECT_DOUBLE_EQ(busy, 192 * 3);
}

}  // namespace
}  // namespace crosstrain::planner
