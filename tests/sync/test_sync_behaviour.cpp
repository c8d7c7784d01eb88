// What the sync strategies do, not only where they end up: `async` lets a fast worker run ahead of a slow one
// (it completes many more steps in the same wall time and sees stale updates), `gossip` pairs every rank with at
// most one partner per round, sends exactly its parameters, and drives the replicas' disagreement to zero.
//
// Strategy level: ranks are threads over the in-process back end, the "parameters" are plain tensors and the
// training loop is written out here (a fake gradient step, then after_step). One real `crosstrain train` run
// (SyncBehaviourCli, label train) checks that async with a slow rank still learns and that rank 0 is not paced by
// the slow rank.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cmath>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "cli_fixture.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/sync/strategy.h"

using namespace crosstrain;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// ---- a communicator that counts what passes through it ----------------------------------------------------

struct Message {
  int peer;
  int tag;
  int64_t bytes;
};

// What one rank's communicator (and the groups split from it) did. Touched by the rank's own thread only (the
// gossip strategy has no threads of its own); the mutex keeps that true should it grow some.
struct Traffic {
  std::mutex m;
  std::vector<Message> sends, recvs;
  int64_t collectives = 0;
};

class CountingCommunicator : public comm::Communicator {
 public:
  // `inner` is not owned (a FakeWorld::run communicator) unless `owned` holds it.
  CountingCommunicator(comm::Communicator& inner, Traffic& traffic, std::unique_ptr<comm::Communicator> owned = {})
      : Communicator(inner.backend() + "+count", inner.name(), inner.rank(), inner.size(), inner.timeout()),
        inner_(inner), owned_(std::move(owned)), traffic_(traffic) {}

  void set_step(int64_t step) override {
    Communicator::set_step(step);
    inner_.set_step(step);
  }
  comm::WorkPtr broadcast(at::Tensor& t, int root) override { return collective([&] { return inner_.broadcast(t, root); }); }
  comm::WorkPtr reduce(at::Tensor& t, int root, comm::ReduceOp op) override {
    return collective([&] { return inner_.reduce(t, root, op); });
  }
  comm::WorkPtr all_reduce(at::Tensor& t, comm::ReduceOp op) override {
    return collective([&] { return inner_.all_reduce(t, op); });
  }
  comm::WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override {
    return collective([&] { return inner_.gather(in, out, root); });
  }
  comm::WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    return collective([&] { return inner_.all_gather(in, out); });
  }
  comm::WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override {
    return collective([&] { return inner_.scatter(in, out, root); });
  }
  comm::WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, comm::ReduceOp op) override {
    return collective([&] { return inner_.reduce_scatter(in, out, op); });
  }
  comm::WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    return collective([&] { return inner_.all_to_all(in, out); });
  }
  comm::WorkPtr barrier() override { return collective([&] { return inner_.barrier(); }); }
  comm::WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    {
      std::lock_guard<std::mutex> lock(traffic_.m);
      traffic_.sends.push_back({dst, tag, static_cast<int64_t>(t.numel() * t.element_size())});
    }
    return inner_.send(t, dst, tag);
  }
  comm::WorkPtr recv(at::Tensor& t, int src, int tag) override {
    {
      std::lock_guard<std::mutex> lock(traffic_.m);
      traffic_.recvs.push_back({src, tag, static_cast<int64_t>(t.numel() * t.element_size())});
    }
    return inner_.recv(t, src, tag);
  }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    {
      std::lock_guard<std::mutex> lock(traffic_.m);
      ++traffic_.collectives;
    }
    auto sub = inner_.split(ranks);
    if (!sub) return nullptr;
    comm::Communicator& ref = *sub;
    return std::make_unique<CountingCommunicator>(ref, traffic_, std::move(sub));
  }

 private:
  template <class F>
  comm::WorkPtr collective(F&& f) {
    {
      std::lock_guard<std::mutex> lock(traffic_.m);
      ++traffic_.collectives;
    }
    return f();
  }
  comm::Communicator& inner_;
  std::unique_ptr<comm::Communicator> owned_;
  Traffic& traffic_;
};

std::vector<float> flat_values(const std::vector<at::Tensor>& params) {
  std::vector<float> out;
  for (const auto& p : params) {
    at::Tensor c = p.detach().reshape(-1).contiguous();
    out.insert(out.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
  }
  return out;
}

// ---- async ------------------------------------------------------------------------------------------------

struct AsyncWorker {
  int64_t steps = 0;
  train::SyncStats stats;
  std::vector<float> final_params;
};

// The parameters every replica starts from, and where the fake gradient pulls them.
std::vector<at::Tensor> async_start() {
  return {at::linspace(-2.0, 3.0, 48).reshape({6, 8}), at::full({10}, 4.0)};
}
std::vector<at::Tensor> async_target() { return {at::full({6, 8}, 0.5), at::linspace(-1.0, 1.0, 10)}; }

}  // namespace

// Two workers; rank 1 sleeps `slow_ms` per step in before_step (sync.slow_rank / sync.slow_ms), both "compute"
// for `compute_ms`. For `wall` seconds each worker steps as fast as it can: a fake gradient step (a small step
// toward a fixed target), then after_step, which pushes and pulls. Synchronous training would keep
// them within a step or two of each other; asynchronous training lets rank 0 run ~(slow_ms + compute_ms) /
// compute_ms times as many steps.
TEST(AsyncBehaviour, FastWorkerRunsManyMoreStepsThanASlowOneAndSeesStaleUpdates) {
  const int n = 2, slow = 1;
  // lr: a push of the fast worker moves the servers lr / 2 of the way to the target. The slow worker makes ~15
  // steps whatever the load (its sleep dominates), so a fast worker that passes the 3x check made >= 45 steps,
  // which leave < 1% of the distance (0.9^45).
  const double slow_ms = 80, compute_ms = 2, lr = 0.2;
  const auto wall = milliseconds(1200);
  std::vector<AsyncWorker> workers(n);
  const auto t0 = Clock::now();
  comm::FakeWorld::run(n, [&](comm::Communicator& c) {
    train::SyncSetup s;
    s.config.mode = train::SyncMode::Async;
    s.config.clusters = 1;
    s.config.slow_rank = slow;
    s.config.slow_ms = slow_ms;
    s.dp = &c;
    s.dp_index = s.world_rank = c.rank();
    s.dp_size = n;
    s.parameters = async_start();
    s.steps = 1000000;  // the loop below ends at a wall-clock deadline instead
    s.timeout = milliseconds(10000);
    std::vector<at::Tensor> params = s.parameters, target = async_target();
    auto strategy = train::make_sync_strategy(s);
    ASSERT_EQ(strategy->gradient_group(), nullptr) << "async has no per-step all-reduce";
    c.barrier()->wait();
    const auto deadline = Clock::now() + wall;
    int64_t step = 0;
    for (bool last = false; !last;) {
      ++step;
      strategy->before_step(step);
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(compute_ms * 1000)));
      for (size_t i = 0; i < params.size(); ++i) params[i].sub_(lr * (params[i] - target[i]));
      last = Clock::now() >= deadline;
      strategy->after_step(step, last);
    }
    workers[c.rank()] = {step, strategy->stats(), flat_values(params)};
  });
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  const AsyncWorker &fast = workers[0], &slowpoke = workers[1];
  std::printf("async: %.2f s; fast rank %lld steps (staleness mean %.2f max %lld), slow rank %lld steps "
              "(staleness mean %.2f max %lld)\n",
              elapsed, (long long)fast.steps, fast.stats.staleness_mean, (long long)fast.stats.staleness_max,
              (long long)slowpoke.steps, slowpoke.stats.staleness_mean, (long long)slowpoke.stats.staleness_max);

  // The slow rank did run (it is not merely absent) ...
  EXPECT_GE(slowpoke.steps, 5);
  // ... and in the same wall time the fast one did several times as many steps (~40x unloaded; synchronous
  // training, or a staleness bound, would give about 1x).
  EXPECT_GE(fast.steps, 3 * slowpoke.steps) << "the fast worker was paced by the slow one";
  // One push per step (period 1), the last step included.
  EXPECT_EQ(fast.stats.exchanges, fast.steps);
  EXPECT_EQ(slowpoke.stats.exchanges, slowpoke.steps);
  // Staleness: the slow worker's pushes land between some pull and push of the fast one ...
  EXPECT_GE(fast.stats.staleness_max, 1);
  EXPECT_GT(fast.stats.staleness_mean, 0.0);
  // ... and between two pushes of the slow worker the fast one pushed many times (lockstep gives 1).
  EXPECT_GE(slowpoke.stats.staleness_mean, 3.0);
  EXPECT_GE(slowpoke.stats.staleness_max, 3);

  // It still converges: the final pull leaves both replicas with the same parameters, near the target.
  ASSERT_EQ(fast.final_params.size(), slowpoke.final_params.size());
  EXPECT_EQ(fast.final_params, slowpoke.final_params) << "replicas differ after the final pull";
  const std::vector<float> start = flat_values(async_start()), target = flat_values(async_target());
  double before = 0, after = 0;
  for (size_t i = 0; i < target.size(); ++i) {
    before = std::max(before, double(std::abs(start[i] - target[i])));
    after = std::max(after, double(std::abs(fast.final_params[i] - target[i])));
  }
  EXPECT_LT(after, 0.05 * before) << "async did not converge to the target";
}

// ---- gossip -----------------------------------------------------------------------------------------------

namespace {

// What one rank saw at one step (after after_step).
struct GossipStep {
  std::vector<Message> sends, recvs;
  int64_t collectives = 0;
  int64_t exchanges = 0;  // delta of stats().exchanges over the step
  int64_t wan_bytes = 0;  // delta of stats().wan_bytes
  std::vector<float> params;
};

struct GossipRun {
  std::vector<std::vector<GossipStep>> steps;  // [rank][step - 1], the final (last) step included
  std::vector<float> initial_mean;
  int64_t param_bytes = 0;
};

// Parameters that differ from rank to rank (and between any two ranks).
std::vector<at::Tensor> gossip_start(int rank) {
  at::Tensor a = at::arange(0, 128, at::kFloat).reshape({16, 8}), b = at::arange(0, 24, at::kFloat);
  const double f = 0.37 * (rank + 1);
  return {at::sin(a * f) * (rank + 1) + rank, at::cos(b * f) - 0.5 * rank};
}

// `rounds` gossip rounds every `period` steps, no gradient steps, then one last step.
GossipRun run_gossip(int n, int64_t period, int64_t clusters, int64_t rounds) {
  GossipRun run;
  run.steps.resize(n);
  const int64_t last_step = rounds * period + 1;
  {
    std::vector<double> sum;
    for (int r = 0; r < n; ++r) {
      auto v = flat_values(gossip_start(r));
      sum.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
      run.param_bytes = 4 * static_cast<int64_t>(v.size());
    }
    for (double x : sum) run.initial_mean.push_back(static_cast<float>(x / n));
  }
  comm::FakeWorld::run(n, [&](comm::Communicator& world) {
    Traffic traffic;
    CountingCommunicator c(world, traffic);
    train::SyncSetup s;
    s.config.mode = train::SyncMode::Gossip;
    s.config.period = period;
    s.config.clusters = clusters;
    s.dp = &c;
    s.dp_index = s.world_rank = c.rank();
    s.dp_size = n;
    s.parameters = gossip_start(c.rank());
    s.steps = last_step;
    s.timeout = milliseconds(10000);
    std::vector<at::Tensor> params = s.parameters;
    auto strategy = train::make_sync_strategy(s);
    ASSERT_EQ(strategy->gradient_group(), nullptr) << "gossip has no per-step all-reduce";
    size_t sends = traffic.sends.size(), recvs = traffic.recvs.size();
    int64_t collectives = traffic.collectives;
    train::SyncStats before = strategy->stats();
    auto& mine = run.steps[c.rank()];
    for (int64_t step = 1; step <= last_step; ++step) {
      strategy->before_step(step);
      strategy->after_step(step, step == last_step);
      const train::SyncStats now = strategy->stats();
      GossipStep g;
      {
        std::lock_guard<std::mutex> lock(traffic.m);
        g.sends.assign(traffic.sends.begin() + sends, traffic.sends.end());
        g.recvs.assign(traffic.recvs.begin() + recvs, traffic.recvs.end());
        g.collectives = traffic.collectives - collectives;
        sends = traffic.sends.size(), recvs = traffic.recvs.size(), collectives = traffic.collectives;
      }
      g.exchanges = now.exchanges - before.exchanges;
      g.wan_bytes = now.wan_bytes - before.wan_bytes;
      g.params = flat_values(params);
      before = now;
      mine.push_back(std::move(g));
    }
  }, milliseconds(10000));
  return run;
}

// Disagreement of the replicas: root mean square distance of each replica to their mean, and the largest
// absolute difference of any element between any two replicas.
struct Spread {
  double rms = 0, max_diff = 0;
};
Spread spread(const std::vector<std::vector<float>>& replicas) {
  const size_t n = replicas.size(), m = replicas[0].size();
  Spread s;
  double sq = 0;
  for (size_t i = 0; i < m; ++i) {
    double mean = 0, lo = replicas[0][i], hi = replicas[0][i];
    for (size_t r = 0; r < n; ++r) {
      mean += replicas[r][i];
      lo = std::min(lo, double(replicas[r][i]));
      hi = std::max(hi, double(replicas[r][i]));
    }
    mean /= double(n);
    for (size_t r = 0; r < n; ++r) sq += (replicas[r][i] - mean) * (replicas[r][i] - mean);
    s.max_diff = std::max(s.max_diff, hi - lo);
  }
  s.rms = std::sqrt(sq / double(n));
  return s;
}

struct GossipCase {
  int n;
  int64_t period, clusters, rounds;
};

void PrintTo(const GossipCase& k, std::ostream* os) {
  *os << k.n << " ranks, period " << k.period << ", " << k.clusters << " clusters, " << k.rounds << " rounds";
}

std::string case_name(const ::testing::TestParamInfo<GossipCase>& info) {
  return "n" + std::to_string(info.param.n) + "_period" + std::to_string(info.param.period) + "_clusters" +
         std::to_string(info.param.clusters);
}

}  // namespace

class GossipBehaviour : public ::testing::TestWithParam<GossipCase> {};

// Per round: every rank sends its parameters to exactly one partner, who sends its own back (or the rank sits
// out: only when the group is odd, exactly one rank); nothing else is sent, no collective runs (no global
// barrier), stats().exchanges counts the round, and wan_bytes counts the parameters when the partner is in
// another cluster. Steps between rounds (period > 1) move nothing.
TEST_P(GossipBehaviour, EachRoundIsOnePairwiseExchangeOfTheParameters) {
  const GossipCase k = GetParam();
  const GossipRun run = run_gossip(k.n, k.period, k.clusters, k.rounds);
  const std::vector<int> cluster_of = train::block_clusters(k.n, static_cast<int>(k.clusters));
  for (int64_t step = 1; step <= k.rounds * k.period; ++step) {
    const size_t at = static_cast<size_t>(step - 1);
    if (step % k.period != 0) {
      for (int r = 0; r < k.n; ++r) {
        const GossipStep& g = run.steps[r][at];
        EXPECT_TRUE(g.sends.empty() && g.recvs.empty() && g.collectives == 0 && g.exchanges == 0)
            << "rank " << r << " communicated at step " << step << " between rounds";
        EXPECT_EQ(g.params, run.steps[r][at > 0 ? at - 1 : 0].params) << "step " << step;
      }
      continue;
    }
    int sat_out = 0;
    int64_t bytes = 0;
    for (int r = 0; r < k.n; ++r) {
      const GossipStep& g = run.steps[r][at];
      SCOPED_TRACE("rank " + std::to_string(r) + ", step " + std::to_string(step));
      EXPECT_EQ(g.collectives, 0) << "a collective (global barrier) in a gossip round";
      ASSERT_LE(g.sends.size(), 1u) << "more than one partner in one round";
      ASSERT_EQ(g.recvs.size(), g.sends.size());
      EXPECT_EQ(g.exchanges, static_cast<int64_t>(g.sends.size()));
      if (g.sends.empty()) {
        ++sat_out;
        EXPECT_EQ(g.wan_bytes, 0);
        continue;
      }
      const int p = g.sends[0].peer;
      EXPECT_NE(p, r);
      EXPECT_EQ(g.recvs[0].peer, p) << "received from someone else than it sent to";
      EXPECT_EQ(g.sends[0].bytes, run.param_bytes) << "bytes sent per exchange: the parameters, once";
      EXPECT_EQ(g.recvs[0].bytes, run.param_bytes);
      bytes += g.sends[0].bytes;
      // The partner's partner is this rank.
      const GossipStep& theirs = run.steps[p][at];
      ASSERT_EQ(theirs.sends.size(), 1u) << "partner " << p << " sat out";
      EXPECT_EQ(theirs.sends[0].peer, r) << "partner " << p << " paired with someone else";
      EXPECT_EQ(g.wan_bytes, cluster_of[p] != cluster_of[r] ? run.param_bytes : 0) << "partner " << p;
    }
    // A maximal matching: everybody pairs up, one rank sits out when the group is odd.
    EXPECT_EQ(sat_out, k.n % 2) << "step " << step;
    EXPECT_EQ(bytes, (k.n - sat_out) * run.param_bytes) << "bytes sent in the round of step " << step;
  }
  // Power of two: the hypercube's first log2(n) rounds meet log2(n) different partners.
  if ((k.n & (k.n - 1)) == 0) {
    int bits = 0;
    while ((1 << bits) < k.n) ++bits;
    for (int r = 0; r < k.n; ++r) {
      std::vector<int> partners;
      for (int64_t round = 0; round < bits; ++round) partners.push_back(run.steps[r][(round + 1) * k.period - 1].sends.at(0).peer);
      std::sort(partners.begin(), partners.end());
      EXPECT_EQ(std::unique(partners.begin(), partners.end()), partners.end()) << "rank " << r << " met a partner twice";
    }
  }
}

// Pure averaging (no gradient steps) from different parameters: the mean is kept, the disagreement falls every
// round; on a power-of-two group the replicas are bit-identical after log2(n) rounds.
TEST_P(GossipBehaviour, ReplicasAgreeOverRounds) {
  const GossipCase k = GetParam();
  const GossipRun run = run_gossip(k.n, k.period, k.clusters, k.rounds);
  auto replicas_at = [&](int64_t round) {  // after `round` rounds (0: the start)
    std::vector<std::vector<float>> out;
    for (int r = 0; r < k.n; ++r)
      out.push_back(round == 0 ? flat_values(gossip_start(r)) : run.steps[r][round * k.period - 1].params);
    return out;
  };
  std::vector<Spread> s;
  for (int64_t round = 0; round <= k.rounds; ++round) s.push_back(spread(replicas_at(round)));
  std::string trace = "rms distance to the mean per round:";
  for (const auto& x : s) trace += " " + std::to_string(x.rms);
  SCOPED_TRACE(trace);
  ASSERT_GT(s[0].rms, 1.0);

  // Averaging keeps the mean of the replicas.
  for (int64_t round = 1; round <= k.rounds; ++round) {
    auto reps = replicas_at(round);
    double worst = 0;
    for (size_t i = 0; i < run.initial_mean.size(); ++i) {
      double mean = 0;
      for (const auto& rep : reps) mean += rep[i];
      worst = std::max(worst, std::abs(mean / k.n - run.initial_mean[i]));
    }
    EXPECT_LT(worst, 1e-4) << "the replicas' mean moved by round " << round;
  }

  const bool power_of_two = (k.n & (k.n - 1)) == 0;
  int bits = 0;
  while ((1 << bits) < k.n) ++bits;
  const int64_t strict_until = power_of_two ? bits : k.rounds;
  ASSERT_LE(strict_until, k.rounds);
  for (int64_t round = 1; round <= strict_until; ++round)
    EXPECT_LT(s[round].rms, s[round - 1].rms) << "disagreement did not fall in round " << round;
  if (power_of_two) {
    for (int64_t round = bits; round <= k.rounds; ++round)
      EXPECT_EQ(s[round].max_diff, 0.0) << "replicas not identical after round " << round << " of a hypercube of "
                                        << k.n;
    for (int64_t round = 1; round < bits; ++round) EXPECT_GT(s[round].max_diff, 0.0) << "round " << round;
  } else {
    // One pair-averaging sweep shrinks the spread by about 2x per round here; 8 rounds leave well under 1%.
    EXPECT_LT(s[k.rounds].rms, 0.01 * s[0].rms);
  }

  // The last step averages everything: every replica holds the mean.
  double worst = 0;
  for (int r = 0; r < k.n; ++r)
    for (size_t i = 0; i < run.initial_mean.size(); ++i)
      worst = std::max(worst, double(std::abs(run.steps[r].back().params[i] - run.initial_mean[i])));
  EXPECT_LT(worst, 1e-4) << "after the final average";
  EXPECT_EQ(spread({run.steps[0].back().params, run.steps[k.n - 1].back().params}).max_diff, 0.0);
}

INSTANTIATE_TEST_SUITE_P(Groups, GossipBehaviour,
                         ::testing::Values(GossipCase{4, 1, 2, 4}, GossipCase{8, 1, 2, 5}, GossipCase{3, 1, 1, 8},
                                           GossipCase{6, 2, 3, 8}),
                         case_name);

// ---- a real run ---------------------------------------------------------------------------------------------

// `crosstrain train --nproc 2` with sync.mode = async and rank 1 slowed: rank 0 (which writes the metrics) is not
// paced by rank 1 until the final barrier, it takes in rank 1's (stale) updates, and the loss still falls.
// Elastic training re-shards the parameter server over a new generation's workers (SyncStrategy::rebase): the
// servers start from the survivors' last pulls, averaged (one of the old shards went with its rank; every pull
// holds a copy of every shard); a survivor keeps its parameters and pull, so the progress it has not pushed yet
// arrives with its next push; a joiner starts from the servers' parameters; every clock starts at the
// generation's first step (ssp with staleness 0 would wait for clock 10 from workers still at 0 otherwise).
TEST(ServerRebase, ANewGenerationsServersStartFromTheSurvivorsPullsAndAJoinerFromThem) {
  const int n = 3, joiner = 2;
  std::vector<std::vector<float>> final_params(n), after_rebase(n);
  comm::FakeWorld::run(n, [&](comm::Communicator& c) {
    train::SyncSetup s;
    s.config.mode = train::SyncMode::Ssp;
    s.config.clusters = 1;
    s.config.period = 1;
    s.config.staleness = 0;
    s.dp = &c;
    s.dp_index = s.world_rank = c.rank();
    s.dp_size = n;
    s.parameters = {at::zeros({5})};
    s.steps = 12;
    s.timeout = milliseconds(3000);
    std::vector<at::Tensor> params = s.parameters;
    auto strategy = train::make_sync_strategy(s);
    // What each carried from the last generation: rank 0 pulled 1 and trained on to 1.5, rank 1 pulled 3 and
    // made no progress; the joiner holds a copy of some donor's state.
    const std::vector<float> pulled = {1.0f, 3.0f, 100.0f}, now = {1.5f, 3.0f, 7.0f};
    std::vector<at::Tensor> views = strategy->live_tensors();
    ASSERT_EQ(views.size(), 1u);
    views[0].fill_(pulled[c.rank()]);
    params[0].fill_(now[c.rank()]);
    strategy->rebase(11, c.rank() == joiner);
    after_rebase[c.rank()] = flat_values(params);
    for (int64_t step = 11; step <= 12; ++step) {
      strategy->before_step(step);
      strategy->after_step(step, step == 12);
    }
    final_params[c.rank()] = flat_values(params);
  });
  EXPECT_EQ(after_rebase[0], std::vector<float>(5, 1.5f));  // survivors keep their own
  EXPECT_EQ(after_rebase[1], std::vector<float>(5, 3.0f));
  EXPECT_EQ(after_rebase[joiner], std::vector<float>(5, 2.0f));  // the mean of the survivors' pulls
  // The servers: 2, plus rank 0's unpushed 0.5 over three workers; everyone ends with them.
  for (int r = 0; r < n; ++r)
    for (float v : final_params[r]) EXPECT_NEAR(v, 2.0f + 0.5f / 3, 1e-6) << "rank " << r;
}

TEST(SyncBehaviourCli, AsyncWithASlowRankStillLearnsAndTheFastRankRunsAhead) {
  using namespace crosstrain::testing;
  // Rank 0 needs ~5 ms a step, rank 1 ~45: rank 0 runs its steps in a fraction of rank 1's time, long enough for
  // several of rank 1's pushes to land in between.
  const int steps = 100;
  const double slow_ms = 40;
  auto dir = fresh_dir("async_slow_rank");
  auto args = tiny_args(dir, 2, steps);
  args.insert(args.end(), {"--set", "sync.mode=async", "--set", "sync.slow_rank=1", "--set",
                           "sync.slow_ms=" + std::to_string(slow_ms), "--set", "train.eval_every=0"});
  auto res = run_process(args, {}, milliseconds(120000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  auto rows = read_metrics(dir);
  ASSERT_EQ(rows.size(), static_cast<size_t>(steps)) << res.output;
  for (const auto& row : rows) ASSERT_EQ(row["sync_mode"], "async");
  auto time_at = [&](int step) { return rows[step - 1]["time_s"].get<double>(); };
  // Rank 0's steps 2 .. steps - 1, and the same plus the final barrier (which waits for rank 1's last step).
  const double ahead_s = time_at(steps - 1) - time_at(1), whole_s = time_at(steps) - time_at(1);
  std::printf("async CLI: %.1f s; rank 0 steps 2..%d in %.2f s, with the final barrier %.2f s; loss %.3f -> %.3f; "
              "staleness mean %.2f max %lld\n",
              res.seconds, steps - 1, ahead_s, whole_s, rows.front()["loss"].get<double>(),
              rows.back()["loss"].get<double>(), rows.back()["staleness_mean"].get<double>(),
              (long long)rows.back()["staleness_max"].get<int64_t>());

  // Asynchrony: every step of rank 1 takes more than slow_ms, so in lockstep rank 0 would need at least
  // (steps - 2) * slow_ms for its steps 2 .. steps - 1 (4.6 s measured with a barrier per push); it needs a
  // fraction of that and of rank 1's run (1/10 unloaded, 1/4 with three runs at once on 2 cores).
  const double lockstep_s = (steps - 2) * slow_ms / 1000;
  EXPECT_LT(ahead_s, 0.6 * lockstep_s) << "rank 0 was paced by the slow rank";
  EXPECT_LT(ahead_s, 0.6 * whole_s) << "rank 0 was paced by the slow rank";
  EXPECT_GT(whole_s, 0.9 * lockstep_s) << "the final barrier waits for the slow rank's last step";
  // Rank 1's pushes landed while rank 0 ran: the updates did mix.
  EXPECT_GE(rows.back()["staleness_max"].get<int64_t>(), 1);
  EXPECT_EQ(rows.back()["sync_exchanges"].get<int64_t>(), steps);

  // Convergence: the loss falls (first five steps against the last five).
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += rows[i]["loss"].get<double>() / 5;
    last += rows[steps - 1 - i]["loss"].get<double>() / 5;
  }
  EXPECT_LT(last, first - 0.3) << "async with a slow rank did not learn";
}
