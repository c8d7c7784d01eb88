// Pipeline schedules: the invariants on many shapes, simulated bubbles and memory against the literature,
// hand-checked action lists, and the errors for impossible specs and broken schedules.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/parallel/schedule.h"

using namespace crosstrain;
using namespace crosstrain::parallel;

namespace {

using Actions = std::vector<std::vector<Action>>;

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}

// Every shape the invariants are checked on: p in 1..8, m in {1, p, 2p, 4p+1}; interleaved (which needs p >= 2
// and m % p == 0) with v in {2, 3} and m in {p, 2p, 4p}.
std::vector<ScheduleSpec> all_shapes() {
  std::vector<ScheduleSpec> shapes;
  for (ScheduleKind kind :
       {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1, ScheduleKind::ZeroBubbleH2}) {
    for (int p = 1; p <= 8; ++p) {
      std::vector<int> ms = {1, p, 2 * p, 4 * p + 1};
      if (p == 1) ms = {1, 2, 5};  // 1 == p
      for (int m : ms) shapes.push_back({kind, p, m, 1});
    }
  }
  for (int p = 2; p <= 8; ++p)
    for (int v : {2, 3})
      for (int m : {p, 2 * p, 4 * p}) shapes.push_back({ScheduleKind::Interleaved1F1B, p, m, v});
  return shapes;
}

std::string shape_name(const testing::TestParamInfo<ScheduleSpec>& info) {
  const ScheduleSpec& s = info.param;
  const char* kind = s.kind == ScheduleKind::GPipe            ? "GPipe"
                     : s.kind == ScheduleKind::OneFOneB       ? "OneFOneB"
                     : s.kind == ScheduleKind::Interleaved1F1B ? "Interleaved"
                     : s.kind == ScheduleKind::ZeroBubbleH1    ? "ZeroBubbleH1"
                                                               : "ZeroBubbleH2";
  return std::string(kind) + "_p" + std::to_string(s.stages) + "_m" + std::to_string(s.microbatches) + "_v" +
         std::to_string(s.chunks);
}

// The compute actions of one rank, compactly: "F0 B0" (plain), "F0.1" (interleaved: mb.chunk), "b0 w0" (ZB).
std::string computes(const ScheduleSpec& spec, const std::vector<Action>& actions) {
  std::string out;
  for (const Action& a : actions) {
    const char* letter = a.type == ActionType::Forward          ? "F"
                         : a.type == ActionType::Backward       ? "B"
                         : a.type == ActionType::BackwardInput  ? "b"
                         : a.type == ActionType::BackwardWeight ? "w"
                                                                : nullptr;
    if (!letter) continue;
    if (!out.empty()) out += ' ';
    out += letter + std::to_string(a.microbatch);
    if (spec.chunks > 1) out += "." + std::to_string(a.chunk);
  }
  return out;
}

double one_f_one_b_bubble(int p, int m) {
  ScheduleSpec spec{ScheduleKind::OneFOneB, p, m};
  return simulate(spec, build_schedule(spec)).bubble_fraction;
}

// With integer costs every simulated time is an integer and the makespans equal the closed forms exactly
// ((m + p - 1)(f + b) for GPipe and 1F1B, m*v*(f + b) + (p - 1)(f + b) for interleaved, 3m + p - 1 for ZB-H1);
// the tolerance only absorbs the rounding of the division in the fraction.
constexpr double kExact = 1e-12;

class ScheduleShapes : public testing::TestWithParam<ScheduleSpec> {};

}  // namespace

// ---- invariants on every shape ----------------------------------------------------------------------------

TEST_P(ScheduleShapes, PassesTheInvariantCheck) {
  const ScheduleSpec& spec = GetParam();
  Actions actions = build_schedule(spec);
  ASSERT_EQ(actions.size(), static_cast<size_t>(spec.stages));
  EXPECT_EQ(check_schedule(spec, actions), "");
  SimulationResult sim = simulate(spec, actions);
  EXPECT_FALSE(sim.deadlock) << sim.deadlock_detail;
}

TEST_P(ScheduleShapes, PeakActivationsMeetTheBound) {
  const ScheduleSpec& spec = GetParam();
  const int p = spec.stages, m = spec.microbatches, v = spec.chunks;
  SimulationResult sim = simulate(spec, build_schedule(spec));
  ASSERT_EQ(sim.peak_activations.size(), static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) {
    const int peak = sim.peak_activations[r];
    EXPECT_EQ(peak, activation_bound(spec, r)) << "rank " << r;  // the bound is reached, not just met
    switch (spec.kind) {
      case ScheduleKind::GPipe: EXPECT_EQ(peak, m) << "rank " << r; break;
      case ScheduleKind::OneFOneB: EXPECT_LE(peak, p - r) << "rank " << r; break;
      case ScheduleKind::ZeroBubbleH1: EXPECT_LE(peak, p) << "rank " << r; break;
      case ScheduleKind::ZeroBubbleH2: EXPECT_LE(peak, 2 * p - 1) << "rank " << r; break;
      case ScheduleKind::Interleaved1F1B:
        // Megatron: warm-up of (v-1)p + 2(p-1-r) chunk forwards, then one more before the first backward.
        EXPECT_LE(peak, (v - 1) * p + 2 * (p - 1 - r) + 1) << "rank " << r;
        EXPECT_LE(peak, m * v) << "rank " << r;
        break;
    }
  }
}

TEST_P(ScheduleShapes, BubbleMatchesTheLiterature) {
  const ScheduleSpec& spec = GetParam();
  const int p = spec.stages, m = spec.microbatches;
  SimulationResult sim = simulate(spec, build_schedule(spec));  // f = 1, b = 2 (b_input = b_weight = 1)
  const double theory = theoretical_bubble(spec);
  switch (spec.kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB:
      EXPECT_NEAR(sim.bubble_fraction, (p - 1.0) / m, kExact);
      EXPECT_NEAR(sim.bubble_fraction, theory, kExact);
      break;
    case ScheduleKind::Interleaved1F1B:
      EXPECT_NEAR(sim.bubble_fraction, theory, kExact);
      EXPECT_LE(sim.bubble_fraction, one_f_one_b_bubble(p, m) + kExact);
      break;
    case ScheduleKind::ZeroBubbleH1:
      if (p > 1) {
        EXPECT_LT(sim.bubble_fraction, one_f_one_b_bubble(p, m));
      }
      if (m >= p) {
        EXPECT_NEAR(sim.bubble_fraction, theory, kExact);
      }
      break;
    case ScheduleKind::ZeroBubbleH2:
      if (p > 1) {
        EXPECT_LT(sim.bubble_fraction, one_f_one_b_bubble(p, m));
      }
      // Never below rank p-1's start-up; reaching it once the warm-up can be filled.
      EXPECT_GE(sim.bubble_fraction, theory - kExact);
      if (m >= 2 * p - 1) {
        EXPECT_NEAR(sim.bubble_fraction, theory, kExact);
      }
      break;
  }
  if (p == 1) {
    EXPECT_EQ(sim.bubble_fraction, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Schedule, ScheduleShapes, testing::ValuesIn(all_shapes()), shape_name);

// ---- bubbles and memory beyond the default costs and shapes --------------------------------------------------

TEST(ScheduleBubble, FourStagesEightMicrobatches) {
  auto run = [](ScheduleKind kind, int v) {
    ScheduleSpec spec{kind, 4, 8, v};
    return simulate(spec, build_schedule(spec));
  };
  SimulationResult gpipe = run(ScheduleKind::GPipe, 1), one = run(ScheduleKind::OneFOneB, 1),
                   inter = run(ScheduleKind::Interleaved1F1B, 2), zb = run(ScheduleKind::ZeroBubbleH1, 1);
  EXPECT_DOUBLE_EQ(gpipe.makespan, 33);  // (m + p - 1) * 3
  EXPECT_DOUBLE_EQ(one.makespan, 33);
  EXPECT_DOUBLE_EQ(inter.makespan, 57);  // m*v*3 + (p - 1) * 3
  EXPECT_DOUBLE_EQ(zb.makespan, 27);     // 3m + p - 1
  EXPECT_DOUBLE_EQ(gpipe.bubble_fraction, 0.375);
  EXPECT_DOUBLE_EQ(one.bubble_fraction, 0.375);
  EXPECT_DOUBLE_EQ(inter.bubble_fraction, 0.1875);
  EXPECT_DOUBLE_EQ(zb.bubble_fraction, 0.125);
  EXPECT_EQ(gpipe.peak_activations, (std::vector<int>{8, 8, 8, 8}));
  EXPECT_EQ(one.peak_activations, (std::vector<int>{4, 3, 2, 1}));
  EXPECT_EQ(inter.peak_activations, (std::vector<int>{11, 9, 7, 5}));  // chunk activations, half a stage each
  EXPECT_EQ(zb.peak_activations, (std::vector<int>{4, 4, 4, 4}));
}

TEST(ScheduleBubble, ZeroBubbleBeatsOneFOneBWithFewMicrobatches) {
  for (int p = 2; p <= 8; ++p) {
    for (int m = 1; m < p; ++m) {
      ScheduleSpec spec{ScheduleKind::ZeroBubbleH1, p, m};
      Actions actions = build_schedule(spec);
      EXPECT_EQ(check_schedule(spec, actions), "") << "p=" << p << " m=" << m;
      SimulationResult sim = simulate(spec, actions);
      EXPECT_LT(sim.bubble_fraction, one_f_one_b_bubble(p, m)) << "p=" << p << " m=" << m;
      EXPECT_GE(sim.bubble_fraction, theoretical_bubble(spec) - kExact) << "p=" << p << " m=" << m;
    }
  }
}

TEST(ScheduleBubble, ZeroBubbleH2BeatsH1WhenWeightGradientsAreCheaper) {
  // b_weight < b_input (our linear-only weight pass against attention, norms and activations in the input pass):
  // ZB-H1 keeps (p-1)(f + b_input - b_weight); ZB-H2 comes close to rank p-1's start-up, (p-1) f.
  const SimulationCosts costs{1, 2, 1.4};
  for (int p : {2, 3, 4}) {
    for (int m : {2 * p, 4 * p}) {
      ScheduleSpec h1{ScheduleKind::ZeroBubbleH1, p, m}, h2{ScheduleKind::ZeroBubbleH2, p, m};
      Actions actions = build_schedule(h2);
      ASSERT_EQ(check_schedule(h2, actions), "") << "p=" << p << " m=" << m;
      const double b1 = simulate(h1, build_schedule(h1), costs).bubble_fraction;
      const double b2 = simulate(h2, actions, costs).bubble_fraction;
      // The order is built with unit costs, so it comes near rank p-1's start-up without reaching it.
      EXPECT_GE(b2, theoretical_bubble(h2) - kExact) << "p=" << p << " m=" << m;
      EXPECT_LT(b2, b1 - 0.2 * (b1 - theoretical_bubble(h2))) << "p=" << p << " m=" << m;
    }
  }
}

TEST(ScheduleBubble, OtherCostsKeepTheClassicFormulas) {
  // GPipe, 1F1B and interleaved bubbles do not depend on the ratio of forward to backward time.
  for (SimulationCosts costs : {SimulationCosts{1, 3, 1.5}, SimulationCosts{2, 3, 1}}) {
    for (int p : {2, 4, 5}) {
      for (int m : {p, 2 * p}) {
        for (ScheduleSpec spec : {ScheduleSpec{ScheduleKind::GPipe, p, m}, ScheduleSpec{ScheduleKind::OneFOneB, p, m},
                                  ScheduleSpec{ScheduleKind::Interleaved1F1B, p, m, 2}}) {
          SimulationResult sim = simulate(spec, build_schedule(spec), costs);
          EXPECT_NEAR(sim.bubble_fraction, theoretical_bubble(spec), kExact)
              << to_string(spec.kind) << " p=" << p << " m=" << m << " f=" << costs.forward;
        }
      }
    }
  }
  // ZB-H1 with the paper's other regime, b_weight < b_input: (p-1)(f + b_input - b_weight) / (m(f + b)).
  ScheduleSpec zb{ScheduleKind::ZeroBubbleH1, 4, 8};
  SimulationResult sim = simulate(zb, build_schedule(zb), SimulationCosts{1, 2, 1.5});
  EXPECT_NEAR(sim.bubble_fraction, 3 * (1 + 1.5 - 0.5) / (8 * 3.0), kExact);
}

// ---- hand-checked action lists -----------------------------------------------------------------------------

TEST(ScheduleLists, OneFOneBTwoStagesTwoMicrobatches) {
  ScheduleSpec spec{ScheduleKind::OneFOneB, 2, 2};
  using T = ActionType;
  Actions expected = {
      {{T::Forward, 0, 0}, {T::SendActivation, 0, 0}, {T::Forward, 1, 0}, {T::SendActivation, 1, 0},
       {T::RecvGrad, 0, 0}, {T::Backward, 0, 0}, {T::RecvGrad, 1, 0}, {T::Backward, 1, 0}},
      {{T::RecvActivation, 0, 0}, {T::Forward, 0, 0}, {T::Backward, 0, 0}, {T::SendGrad, 0, 0},
       {T::RecvActivation, 1, 0}, {T::Forward, 1, 0}, {T::Backward, 1, 0}, {T::SendGrad, 1, 0}},
  };
  EXPECT_EQ(build_schedule(spec), expected);
}

TEST(ScheduleLists, ZeroBubbleTwoStagesTwoMicrobatches) {
  ScheduleSpec spec{ScheduleKind::ZeroBubbleH1, 2, 2};
  using T = ActionType;
  Actions expected = {
      {{T::Forward, 0, 0}, {T::SendActivation, 0, 0}, {T::Forward, 1, 0}, {T::SendActivation, 1, 0},
       {T::RecvGrad, 0, 0}, {T::BackwardInput, 0, 0}, {T::BackwardWeight, 0, 0},
       {T::RecvGrad, 1, 0}, {T::BackwardInput, 1, 0}, {T::BackwardWeight, 1, 0}},
      // The last stage sends the input gradient of micro-batch 1 before the weight gradient of micro-batch 0.
      {{T::RecvActivation, 0, 0}, {T::Forward, 0, 0}, {T::BackwardInput, 0, 0}, {T::SendGrad, 0, 0},
       {T::RecvActivation, 1, 0}, {T::Forward, 1, 0}, {T::BackwardInput, 1, 0}, {T::SendGrad, 1, 0},
       {T::BackwardWeight, 0, 0}, {T::BackwardWeight, 1, 0}},
  };
  EXPECT_EQ(build_schedule(spec), expected);
}

TEST(ScheduleLists, ComputeOrderOfEachKind) {
  auto order = [](ScheduleSpec spec) {
    std::vector<std::string> ranks;
    for (const auto& actions : build_schedule(spec)) ranks.push_back(computes(spec, actions));
    return ranks;
  };
  EXPECT_EQ(order({ScheduleKind::GPipe, 2, 3}),
            (std::vector<std::string>{"F0 F1 F2 B0 B1 B2", "F0 F1 F2 B0 B1 B2"}));
  EXPECT_EQ(order({ScheduleKind::OneFOneB, 3, 4}),
            (std::vector<std::string>{"F0 F1 F2 B0 F3 B1 B2 B3", "F0 F1 B0 F2 B1 F3 B2 B3",
                                      "F0 B0 F1 B1 F2 B2 F3 B3"}));
  // The paper's ZB-H1 figure: rank 0 runs b and w together; the last rank defers p-1 weight gradients.
  EXPECT_EQ(order({ScheduleKind::ZeroBubbleH1, 3, 4}),
            (std::vector<std::string>{"F0 F1 F2 b0 w0 F3 b1 w1 b2 w2 b3 w3", "F0 F1 b0 F2 b1 w0 F3 b2 w1 b3 w2 w3",
                                      "F0 b0 F1 b1 F2 b2 w0 F3 b3 w1 w2 w3"}));
  // Megatron's interleaving: micro-batches in groups of p through chunk 0, then chunk 1; backwards mirror it.
  // Rank 0 warms up with (v-1)p + 2(p-1) = 4 forwards (all of them), rank 1 with 2.
  EXPECT_EQ(order({ScheduleKind::Interleaved1F1B, 2, 2, 2}),
            (std::vector<std::string>{"F0.0 F1.0 F0.1 F1.1 B0.1 B1.1 B0.0 B1.0",
                                      "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 B0.0 B1.0"}));
}

TEST(ScheduleLists, SingleStageNeedsNoCommunication) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::ZeroBubbleH1}) {
    const Actions actions = build_schedule({kind, 1, 3});
    for (const Action& a : actions[0]) {
      EXPECT_NE(a.type, ActionType::RecvActivation);
      EXPECT_NE(a.type, ActionType::SendActivation);
      EXPECT_NE(a.type, ActionType::RecvGrad);
      EXPECT_NE(a.type, ActionType::SendGrad);
    }
  }
}

TEST(ScheduleLists, PeersFollowTheInterleavedLayout) {
  ScheduleSpec spec{ScheduleKind::Interleaved1F1B, 4, 4, 2};  // rank r holds virtual stages r and r + 4
  EXPECT_EQ(virtual_stage(spec, 1, 1), 5);
  Peer to = peer_of(spec, 3, {ActionType::SendActivation, 0, 0});  // stage 3 -> stage 4 = rank 0, chunk 1
  EXPECT_EQ(to.rank, 0);
  EXPECT_EQ(to.chunk, 1);
  Peer from = peer_of(spec, 0, {ActionType::RecvActivation, 0, 1});
  EXPECT_EQ(from.rank, 3);
  EXPECT_EQ(from.chunk, 0);
  Peer grad = peer_of(spec, 0, {ActionType::SendGrad, 0, 1});  // stage 4 -> stage 3
  EXPECT_EQ(grad.rank, 3);
  EXPECT_EQ(grad.chunk, 0);
  EXPECT_NE(usage_error([&] { peer_of(spec, 0, {ActionType::SendGrad, 0, 0}); }).find("no peer"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { peer_of(spec, 3, {ActionType::RecvGrad, 0, 1}); }).find("no peer"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { peer_of(spec, 0, {ActionType::Forward, 0, 0}); }).find("not a send or receive"),
            std::string::npos);
}

TEST(ScheduleLists, Names) {
  for (ScheduleKind kind : {ScheduleKind::GPipe, ScheduleKind::OneFOneB, ScheduleKind::Interleaved1F1B,
                            ScheduleKind::ZeroBubbleH1})
    EXPECT_EQ(parse_schedule(to_string(kind)), kind);
  EXPECT_STREQ(to_string(ScheduleKind::ZeroBubbleH1), "zb-h1");
  EXPECT_EQ(to_string(Action{ActionType::RecvGrad, 3, 1}), "RecvGrad(mb 3, chunk 1)");
  std::string error = usage_error([] { parse_schedule("pipedream"); });
  EXPECT_NE(error.find("'pipedream'"), std::string::npos) << error;
  EXPECT_NE(error.find("gpipe, 1f1b, interleaved, zb-h1, zb-h2"), std::string::npos) << error;
}

// ---- impossible specs --------------------------------------------------------------------------------------

TEST(ScheduleSpecs, ImpossibleSpecsAreUsageErrors) {
  struct Case {
    ScheduleSpec spec;
    const char* expected;
  };
  const Case cases[] = {
      {{ScheduleKind::OneFOneB, 0, 4}, "stages must be >= 1, got 0"},
      {{ScheduleKind::GPipe, 2, 0}, "microbatches must be >= 1, got 0"},
      {{ScheduleKind::ZeroBubbleH1, 2, -3}, "microbatches must be >= 1, got -3"},
      {{ScheduleKind::OneFOneB, 2, 4, 2}, "chunks must be 1"},
      {{ScheduleKind::ZeroBubbleH1, 2, 4, 0}, "chunks must be 1"},
      {{ScheduleKind::Interleaved1F1B, 2, 4, 1}, "needs chunks >= 2"},
      {{ScheduleKind::Interleaved1F1B, 4, 6, 2}, "microbatches (6) must be a multiple of stages (4)"},
      {{ScheduleKind::Interleaved1F1B, 1, 4, 2}, "needs at least 2 stages"},
  };
  for (const Case& c : cases) {
    for (const auto& call : std::vector<std::function<void()>>{
             [&] { build_schedule(c.spec); }, [&] { validate(c.spec); }, [&] { theoretical_bubble(c.spec); },
             [&] { check_schedule(c.spec, {}); }, [&] { simulate(c.spec, {}); }}) {
      std::string error = usage_error(call);
      EXPECT_NE(error.find(c.expected), std::string::npos) << error;
      EXPECT_NE(error.find(to_string(c.spec.kind)), std::string::npos) << error;
    }
  }
}

TEST(ScheduleSpecs, ImpossibleCostsAreUsageErrors) {
  ScheduleSpec spec{ScheduleKind::ZeroBubbleH1, 2, 2};
  Actions actions = build_schedule(spec);
  for (SimulationCosts costs : {SimulationCosts{-1, 2, 1}, SimulationCosts{1, 2, 3}, SimulationCosts{0, 0, 0}})
    EXPECT_NE(usage_error([&] { simulate(spec, actions, costs); }).find("costs"), std::string::npos);
}

// ---- broken schedules are caught ---------------------------------------------------------------------------

namespace {
// Position of the first action equal to `a` on `rank`.
size_t position(const Actions& actions, int rank, Action a) {
  for (size_t i = 0; i < actions[rank].size(); ++i)
    if (actions[rank][i] == a) return i;
  ADD_FAILURE() << to_string(a) << " not on rank " << rank;
  return 0;
}
void expect_violation(const ScheduleSpec& spec, const Actions& actions, const std::string& expected) {
  std::string problem = check_schedule(spec, actions);
  EXPECT_NE(problem.find(expected), std::string::npos) << "got: '" << problem << "'";
}
}  // namespace

TEST(ScheduleCheck, WrongShapeOrRange) {
  ScheduleSpec spec{ScheduleKind::OneFOneB, 3, 4};
  Actions actions = build_schedule(spec);
  expect_violation(spec, Actions(actions.begin(), actions.end() - 1), "expected action lists for 3 ranks, got 2");
  Actions bad = actions;
  bad[1][0].microbatch = 4;
  expect_violation(spec, bad, "rank 1, action 0 (RecvActivation(mb 4, chunk 0)): micro-batch or chunk out of range");
  bad = actions;
  bad[2].push_back({ActionType::SendActivation, 0, 0});
  expect_violation(spec, bad, "the last virtual stage has no successor");
  bad = actions;
  bad[0].insert(bad[0].begin(), {ActionType::RecvActivation, 0, 0});
  expect_violation(spec, bad, "virtual stage 0 reads its input from data");
}

TEST(ScheduleCheck, MissingDuplicateOrMisplacedActions) {
  ScheduleSpec spec{ScheduleKind::OneFOneB, 3, 4};
  const Actions actions = build_schedule(spec);
  using T = ActionType;

  Actions bad = actions;
  bad[1].erase(bad[1].begin() + position(bad, 1, {T::SendActivation, 2, 0}));
  expect_violation(spec, bad, "rank 1, micro-batch 2, chunk 0 (virtual stage 1): no SendActivation");

  bad = actions;
  bad[0].push_back({T::Forward, 3, 0});
  expect_violation(spec, bad, "duplicate of action");

  bad = actions;  // receive after the forward that needs it
  std::swap(bad[1][position(bad, 1, {T::RecvActivation, 0, 0})], bad[1][position(bad, 1, {T::Forward, 0, 0})]);
  expect_violation(spec, bad, "RecvActivation after the compute that needs it");

  bad = actions;  // backward before its forward
  std::swap(bad[2][position(bad, 2, {T::Forward, 1, 0})], bad[2][position(bad, 2, {T::Backward, 1, 0})]);
  expect_violation(spec, bad, "Backward before its Forward");

  bad = actions;  // the gradient sent before it is computed
  std::swap(bad[1][position(bad, 1, {T::Backward, 3, 0})], bad[1][position(bad, 1, {T::SendGrad, 3, 0})]);
  expect_violation(spec, bad, "SendGrad before the compute that produces it");
}

TEST(ScheduleCheck, BackwardKindMustMatchTheSchedule) {
  ScheduleSpec zb{ScheduleKind::ZeroBubbleH1, 2, 3};
  ScheduleSpec one{ScheduleKind::OneFOneB, 2, 3};
  expect_violation(zb, build_schedule(one), "zero-bubble schedules split every backward");
  expect_violation(one, build_schedule(zb), "only zero-bubble schedules split the backward");
  Actions bad = build_schedule(zb);
  std::swap(bad[1][position(bad, 1, {ActionType::BackwardInput, 2, 0})],
            bad[1][position(bad, 1, {ActionType::BackwardWeight, 2, 0})]);
  expect_violation(zb, bad, "BackwardWeight before its BackwardInput");
}

TEST(ScheduleCheck, MicrobatchesEnterInOrder) {
  ScheduleSpec spec{ScheduleKind::GPipe, 1, 2};
  Actions bad = build_schedule(spec);  // F0 F1 B0 B1
  std::swap(bad[0][0], bad[0][1]);
  expect_violation(spec, bad, "micro-batches must enter virtual stage 0 in order 0..m-1");
}

TEST(ScheduleCheck, SendsAndReceivesInTheSameOrder) {
  ScheduleSpec spec{ScheduleKind::GPipe, 2, 2};
  Actions bad = build_schedule(spec);  // rank 1: Recv0 F0 Recv1 F1 ...; receive micro-batch 1 first
  std::rotate(bad[1].begin(), bad[1].begin() + 2, bad[1].begin() + 4);
  expect_violation(spec, bad,
                   "rank 0 sends activations to rank 1 in another order than rank 1 receives them: message 0 is "
                   "micro-batch 0 for virtual stage 1, but the receiver expects micro-batch 1");
}

TEST(ScheduleCheck, DeadlockIsReportedNotLooped) {
  ScheduleSpec spec{ScheduleKind::OneFOneB, 2, 2};
  Actions bad = build_schedule(spec);
  // Rank 0 waits for the gradient of micro-batch 0 before sending the activation that produces it.
  auto recv = bad[0].begin() + position(bad, 0, {ActionType::RecvGrad, 0, 0});
  std::rotate(bad[0].begin(), recv, recv + 1);
  SimulationResult sim = simulate(spec, bad);
  EXPECT_TRUE(sim.deadlock);
  EXPECT_EQ(sim.deadlock_detail,
            "rank 0 waits at action 0 (RecvGrad(mb 0, chunk 0) from rank 1); "
            "rank 1 waits at action 0 (RecvActivation(mb 0, chunk 0) from rank 0)");
  expect_violation(spec, bad, "deadlock: rank 0 waits at action 0");
}

TEST(ScheduleCheck, MemoryBoundOfTheKind) {
  // A GPipe order presented as 1F1B is valid in every other respect but holds all m activations.
  ScheduleSpec gpipe{ScheduleKind::GPipe, 2, 4}, one{ScheduleKind::OneFOneB, 2, 4};
  expect_violation(one, build_schedule(gpipe), "rank 0 holds 4 activations at its peak; 1f1b allows 2");
}
