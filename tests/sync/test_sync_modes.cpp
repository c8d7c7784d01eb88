// Synchronization strategies (sync.mode): parity where one exists, convergence against sync otherwise.
// Ranks are threads over the in-process back end; clusters are consecutive blocks of ranks (sync.clusters).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/core/error.h"
#include "crosstrain/sync/param_server.h"
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"
#include "../../src/sync/strategy_base.h"

using namespace crosstrain;

namespace {

struct Outcome {
  std::vector<double> losses;
  std::vector<float> parameters;
  double val_loss = -1;
  std::vector<std::vector<double>> step_times;  // per rank
  std::vector<int64_t> local_batches;           // per rank: sequences per step of its replica
  nlohmann::json last_row;
};

train::Config base(const std::string& tag, int64_t steps = 20) {
  train::Config c = crosstrain::testing::tiny_config(tag);
  // 30 steps hold only a few outer steps of a fast-moving tiny model: the paper's outer momentum 0.9 overshoots
  // there (momentum builds up to ~5x the pseudo-gradient), so the convergence tests use 0.5.
  c.sync.outer_momentum = 0.5;
  c.train.steps = steps;
  c.train.eval_every = steps;  // the final validation loss only
  c.train.eval_batches = 2;
  return c;
}

Outcome train_with(const train::Config& config, int ranks, bool resume = false) {
  Outcome run;
  run.step_times.resize(ranks);
  run.local_batches.resize(ranks);
  std::mutex m;
  comm::FakeWorld::run(ranks, [&](comm::Communicator& c) {
    train::Trainer trainer(config, c);
    train::TrainOptions options;
    options.quiet = true;
    train::ParameterDump dump;
    options.dump = &dump;
    options.resume = resume;
    auto result = trainer.run(options);
    std::lock_guard<std::mutex> lock(m);
    for (const auto& s : result.steps) run.step_times[c.rank()].push_back(s.step_time_s);
    if (!result.steps.empty()) run.local_batches[c.rank()] = result.steps.back().local_batch;
    if (c.rank() == 0) {
      for (const auto& s : result.steps) run.losses.push_back(s.loss);
      run.parameters = std::move(dump.flat);
      run.val_loss = result.val_loss;
    }
  });
  std::ifstream in(config.run.dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) last = line;
  if (!last.empty()) run.last_row = nlohmann::json::parse(last);
  return run;
}

void expect_same(const Outcome& got, const Outcome& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tolerance * std::abs(want.losses[i])) << what << " step " << i + 1;
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < want.parameters.size(); ++i)
    worst = std::max(worst, std::abs(double(got.parameters[i]) - want.parameters[i]) /
                                std::max(1.0, std::abs(double(want.parameters[i]))));
  EXPECT_LE(worst, tolerance) << what << ": largest parameter difference";
}

}  // namespace

// ---- pure parts -------------------------------------------------------------------------------------------

TEST(SyncLogic, ClusterLayoutGroupsAndCounterparts) {
  auto l = train::cluster_layout({7, 7, 3, 3});
  EXPECT_EQ(l.clusters, 2);
  EXPECT_EQ(l.cluster_of, (std::vector<int>{0, 0, 1, 1}));
  EXPECT_EQ(l.local, (std::vector<std::vector<int>>{{0, 1}, {2, 3}}));
  EXPECT_EQ(l.cross, (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
  EXPECT_TRUE(l.balanced);
  EXPECT_FALSE(train::cluster_layout({0, 0, 1}).balanced);
  EXPECT_EQ(train::block_clusters(6, 3), (std::vector<int>{0, 0, 1, 1, 2, 2}));
  EXPECT_THROW(train::block_clusters(4, 3), UsageError);
}

TEST(SyncLogic, ClusterOfAHostFromTheTopology) {
  comm::Topology t;
  t.hosts = {{"a0", "east", 1, 0}, {"a1", "east", 1, 0}, {"b0", "west", 1, 0}, {"c0", "north", 1, 0}};
  EXPECT_EQ(train::cluster_of_host(t, "a1", "t.toml"), 0);
  EXPECT_EQ(train::cluster_of_host(t, "b0", "t.toml"), 1);
  EXPECT_EQ(train::cluster_of_host(t, "c0", "t.toml"), 2);
  try {
    train::cluster_of_host(t, "zz", "t.toml");
    FAIL() << "an unlisted host must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'zz' is not listed in the topology t.toml"), std::string::npos) << e.what();
  }
}

TEST(SyncLogic, GossipPartnersArePairings) {
  for (int n : {2, 3, 4, 6, 8}) {
    for (int64_t round = 0; round < 6; ++round) {
      for (int i = 0; i < n; ++i) {
        int p = train::gossip_partner(i, n, round);
        ASSERT_GE(p, 0);
        ASSERT_LT(p, n);
        EXPECT_EQ(train::gossip_partner(p, n, round), i) << "n " << n << " round " << round;
      }
    }
  }
  // Power of two: hypercube, so the partners change every round.
  EXPECT_EQ(train::gossip_partner(0, 4, 0), 1);
  EXPECT_EQ(train::gossip_partner(0, 4, 1), 2);
}

TEST(SyncLogic, OuterNesterovStepByHand) {
  auto anchor = torch::tensor({1.0f, 2.0f}), momentum = torch::zeros({2});
  auto delta = torch::tensor({0.5f, -1.0f});
  train::outer_nesterov_step(anchor, momentum, delta, 0.7, 0.9, true);
  // m = delta; update = delta + 0.9 m = 1.9 delta
  EXPECT_TRUE(torch::allclose(momentum, delta));
  EXPECT_TRUE(torch::allclose(anchor, torch::tensor({1.0f - 0.7f * 0.95f, 2.0f + 0.7f * 1.9f})));
  train::outer_nesterov_step(anchor, momentum, delta, 1.0, 0.0, false);  // plain SGD, lr 1: anchor - delta
  EXPECT_TRUE(torch::allclose(anchor, torch::tensor({1.0f - 0.665f - 0.5f, 2.0f + 1.33f + 1.0f})));
  // Streaming offsets: fragments spread over H, the last one on multiples of H.
  EXPECT_EQ(train::fragment_offset(0, 4, 8), 2);
  EXPECT_EQ(train::fragment_offset(3, 4, 8), 8);
}

TEST(SyncLogic, ConfigChecks) {
  train::Config whole;
  EXPECT_THROW(train::apply_override(whole, "sync.mode=paxos"), UsageError);  // refused when the config is read
  train::SyncConfig c;
  c.mode = train::SyncMode::DiLoCo;
  EXPECT_NO_THROW(train::check_sync_config(c, 4, 1, 1, 0));
  // Every mode runs with every layout; only hierarchical sync (whole gradients across clusters) refuses ZeRO.
  EXPECT_NO_THROW(train::check_sync_config(c, 4, 2, 2, 3));
  c.mode = train::SyncMode::Sync;
  c.hierarchical = true;
  EXPECT_NO_THROW(train::check_sync_config(c, 4, 2, 2, 0));
  EXPECT_THROW(train::check_sync_config(c, 4, 1, 1, 1), UsageError);
  c.mode = train::SyncMode::DiLoCo;
  c.hierarchical = false;
  c.clusters = 3;
  EXPECT_THROW(train::check_sync_config(c, 4, 1, 1, 0), UsageError);
}

TEST(SyncLogic, ClusterBatchGivesEachRankItsClustersShareAndWeighsTheOuterMean) {
  auto l = train::cluster_layout({0, 0, 1, 1});
  EXPECT_EQ(train::rank_batches(l, {12, 4}, 2), (std::vector<int64_t>{6, 6, 2, 2}));
  EXPECT_TRUE(train::rank_batches(l, {}, 1).empty());
  EXPECT_THROW(train::rank_batches(l, {12, 2, 2}, 1), UsageError);  // one count per cluster
  EXPECT_THROW(train::rank_batches(l, {12, 6}, 2), UsageError);     // 6 is not divisible by 2 ranks x 2
  // Weighted by share: 12 of 16 sequences count 3x as much as 4 of 16 in the mean over 2 clusters.
  EXPECT_DOUBLE_EQ(train::outer_weight({12, 4}, 0), 1.5);
  EXPECT_DOUBLE_EQ(train::outer_weight({12, 4}, 1), 0.5);
  EXPECT_DOUBLE_EQ(train::outer_weight({8, 8}, 1), 1.0);
  EXPECT_DOUBLE_EQ(train::outer_weight({}, 0), 1.0);
}

// ---- parity -------------------------------------------------------------------------------------------------

TEST(SyncParity, HierarchicalEqualsFlat) {
  train::Config flat = base("sync_flat");
  Outcome want = train_with(flat, 4);
  train::Config hier = base("sync_hier");
  hier.sync.hierarchical = true;
  hier.sync.clusters = 2;
  Outcome got = train_with(hier, 4);
  expect_same(got, want, 1e-5, "hierarchical sync, 2 clusters x 2 ranks");
  EXPECT_GT(got.last_row["wan_bytes"].get<int64_t>(), 0);
}

TEST(SyncParity, DiLoCoWithOneInnerStepOuterLrOneNoMomentumIsDataParallel) {
  // With H = 1, outer lr 1 and no momentum the outer step lands exactly on the inner step's parameters.
  train::Config plain = base("diloco_ref");
  Outcome want = train_with(plain, 2);
  train::Config d = base("diloco_h1");
  d.sync.mode = train::SyncMode::DiLoCo;
  d.sync.inner_steps = 1;
  d.sync.outer_lr = 1.0;
  d.sync.outer_momentum = 0.0;
  d.sync.clusters = 1;
  Outcome got = train_with(d, 2);
  expect_same(got, want, 1e-5, "diloco H=1 lr=1 mu=0");
}

// ---- convergence against sync -------------------------------------------------------------------------------

class SyncConvergence : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_ = new Outcome(train_with(base("conv_sync", 30), 4));
    ASSERT_GT(reference_->val_loss, 0);
  }
  static void TearDownTestSuite() { delete reference_; }
  static void expect_close(const Outcome& r, double tolerance, const std::string& what) {
    ASSERT_GT(r.val_loss, 0) << what;
    EXPECT_LT(r.losses.back(), r.losses.front() - 1.0) << what << " learns";
    EXPECT_NEAR(r.val_loss, reference_->val_loss, tolerance * reference_->val_loss)
        << what << " against sync " << reference_->val_loss;
  }
  static Outcome* reference_;
};
Outcome* SyncConvergence::reference_ = nullptr;

TEST_F(SyncConvergence, DiLoCo) {
  train::Config c = base("conv_diloco", 30);
  c.sync.mode = train::SyncMode::DiLoCo;
  c.sync.inner_steps = 5;
  c.sync.clusters = 2;
  Outcome r = train_with(c, 4);
  expect_close(r, 0.10, "diloco H=5");
  EXPECT_EQ(r.last_row["sync_exchanges"].get<int64_t>(), 6);
  EXPECT_GT(r.last_row["wan_bytes"].get<int64_t>(), 0);
}

TEST_F(SyncConvergence, DiLoCoInt8OuterGradients) {
  train::Config c = base("conv_diloco_int8", 30);
  c.sync.mode = train::SyncMode::DiLoCo;
  c.sync.inner_steps = 5;
  c.sync.clusters = 2;
  train::Config p = base("conv_diloco_f32", 30);
  p.sync = c.sync;
  c.sync.compression = "int8";
  Outcome r = train_with(c, 4), plain = train_with(p, 4);
  expect_close(r, 0.10, "diloco H=5 int8");
  const double ratio = plain.last_row["wan_bytes"].get<double>() / r.last_row["wan_bytes"].get<double>();
  EXPECT_GT(ratio, 3.5) << "int8 outer gradients against float32";
}

TEST_F(SyncConvergence, StreamingDiLoCo) {
  train::Config c = base("conv_streaming", 30);
  c.sync.mode = train::SyncMode::DiLoCo;
  c.sync.inner_steps = 6;
  c.sync.fragments = 3;
  c.sync.overlap_steps = 1;
  c.sync.clusters = 2;
  Outcome r = train_with(c, 4);
  expect_close(r, 0.10, "streaming diloco, 3 fragments");
  // 30 steps, H=6: fragments at 2, 4, 6, 8, ... (14 fragment syncs) plus the final sync of all 3.
  EXPECT_EQ(r.last_row["sync_exchanges"].get<int64_t>(), 14 + 3);
}

TEST_F(SyncConvergence, Gossip) {
  train::Config c = base("conv_gossip", 30);
  c.sync.mode = train::SyncMode::Gossip;
  c.sync.clusters = 2;
  Outcome r = train_with(c, 4);
  expect_close(r, 0.10, "gossip");
}

TEST_F(SyncConvergence, AsyncParameterServer) {
  train::Config c = base("conv_async", 30);
  c.sync.mode = train::SyncMode::Async;
  c.sync.clusters = 2;
  Outcome r = train_with(c, 4);
  expect_close(r, 0.10, "async");
  EXPECT_GE(r.last_row["staleness_max"].get<int64_t>(), 0);
}

TEST_F(SyncConvergence, SspLetsFastRanksRunAheadOfASlowOneWithinTheBound) {
  const double slow_ms = 60;
  const int64_t steps = 30, bound = 3;
  train::Config c = base("conv_ssp", steps);
  c.sync.mode = train::SyncMode::Ssp;
  c.sync.staleness = bound;
  c.sync.clusters = 2;
  c.sync.slow_rank = 3;
  c.sync.slow_ms = slow_ms;
  Outcome r = train_with(c, 4);
  expect_close(r, 0.10, "ssp with a slow rank");
  // Rank 0 is fast: its first `bound` steps do not wait for rank 3 ...
  double first = 0, all = 0;
  for (int64_t i = 0; i < bound; ++i) first += r.step_times[0][i];
  for (double t : r.step_times[0]) all += t;
  EXPECT_LT(first, 0.5 * bound * slow_ms / 1000) << "rank 0 ran ahead";
  // ... and over the run it never gets more than `bound` steps ahead: it is paced by the slow rank.
  EXPECT_GT(all, 0.8 * (steps - bound - 1) * slow_ms / 1000) << "rank 0 stayed within the bound";
}

// ---- every sync mode with every layout ----------------------------------------------------------------------
// Inside each cluster a replica may be split (pp, tp) or sharded (ZeRO): each rank then exchanges only its own
// shard or slice with its counterparts in the other clusters. The result must not depend on the split.

namespace {

train::Config diloco(const std::string& tag, int64_t steps = 12) {
  train::Config c = base(tag, steps);
  c.sync.mode = train::SyncMode::DiLoCo;
  c.sync.inner_steps = 3;
  c.sync.clusters = 2;
  c.sync.outer_lr = 0.7;
  return c;
}

train::Config split(train::Config c, int pp, int tp, int zero = 0) {
  c.parallel.pp = pp;
  c.parallel.tp = tp;
  c.parallel.zero = zero;
  return c;
}

// Losses (and the final validation loss) within `tolerance`; parameters differ in layout, so not compared.
void expect_same_losses(const Outcome& got, const Outcome& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], tolerance * std::abs(want.losses[i])) << what << " step " << i + 1;
  EXPECT_NEAR(got.val_loss, want.val_loss, tolerance * want.val_loss) << what << " validation";
}

// Drops the checkpoints after `step`, so a resumed run starts there.
void keep_checkpoints_up_to(const std::string& run_dir, int64_t step) {
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/checkpoints"))
    if (std::stoll(entry.path().filename().string().substr(5)) > step) std::filesystem::remove_all(entry.path());
}

// Trains `first` with a checkpoint every `step` steps, drops the checkpoints after `step`, and resumes there with
// `then` (the same run dir; another layout if wanted) on `then_ranks` ranks.
Outcome resumed_at(train::Config first, int ranks, int64_t step, const train::Config& then, int then_ranks) {
  first.train.checkpoint_every = step;
  first.train.keep_checkpoints = 0;
  train_with(first, ranks);
  keep_checkpoints_up_to(first.run.dir, step);
  train::Config resumed = then;
  resumed.run.dir = first.run.dir;
  return train_with(resumed, then_ranks, true);
}

}  // namespace

// sync.cluster_batch: clusters of different speed train on uneven shares of the global batch.
TEST(SyncClusterBatch, TheEvenSplitSpelledOutChangesNothing) {
  Outcome want = train_with(diloco("cb_none", 6), 2);
  train::Config c = diloco("cb_even", 6);
  c.sync.cluster_batch = "4,4";
  Outcome got = train_with(c, 2);
  EXPECT_EQ(got.losses, want.losses);  // bit for bit
  EXPECT_EQ(got.parameters, want.parameters);
  EXPECT_EQ(got.val_loss, want.val_loss);
  EXPECT_EQ(got.local_batches, (std::vector<int64_t>{4, 4}));
}

TEST(SyncClusterBatch, UnevenSharesTrainAndEachRankDrawsItsOwn) {
  auto config = [](const std::string& tag, const std::string& counts) {
    train::Config c = diloco(tag, 20);
    c.train.global_batch = 16;
    c.train.micro_batches = 2;
    c.sync.cluster_batch = counts;
    return c;
  };
  Outcome even = train_with(config("cb_even16", ""), 4);
  Outcome r = train_with(config("cb_uneven", "12,4"), 4);  // 2 clusters x 2 ranks: 6 and 2 sequences per rank
  EXPECT_EQ(even.local_batches, (std::vector<int64_t>{4, 4, 4, 4}));
  EXPECT_EQ(r.local_batches, (std::vector<int64_t>{6, 6, 2, 2}));
  EXPECT_EQ(r.last_row.at("local_batch").get<int64_t>(), 6);
  ASSERT_EQ(r.losses.size(), 20u);
  EXPECT_NE(r.losses[1], even.losses[1]);  // other sequences per rank
  EXPECT_LT(r.losses.back(), 0.7 * r.losses.front());
  // The same global batch, only shared unevenly: it learns about as well as the even split.
  EXPECT_LT(r.val_loss, 1.1 * even.val_loss);
}

TEST(SyncClusterBatch, TheOuterStepWeighsEachClusterByItsShare) {
  // Outer SGD with lr 1 and no momentum lands on the mean of the clusters' parameters: 3:1 for "12,4".
  for (const std::string counts : {"12,4", ""}) {
    std::vector<float> landed(2);
    comm::FakeWorld::run(2, [&](comm::Communicator& c) {
      train::SyncSetup s;
      s.config.mode = train::SyncMode::DiLoCo;
      s.config.clusters = 2;
      s.config.inner_steps = 1;
      s.config.outer_lr = 1;
      s.config.outer_momentum = 0;
      s.config.nesterov = false;
      s.config.cluster_batch = counts;
      s.dp = &c;
      s.dp_index = s.world_rank = c.rank();
      s.dp_size = 2;
      s.parameters = {torch::zeros({3})};
      s.steps = 2;
      at::Tensor p = s.parameters[0];
      auto strategy = train::make_sync_strategy(s);
      p.fill_(c.rank() == 0 ? 1.0 : 5.0);  // where each cluster's inner steps took its replica
      strategy->after_step(1, false);
      landed[c.rank()] = p[2].item<float>();
    });
    const float want = counts.empty() ? 3.0f : 2.0f;  // (1 + 5) / 2, or 0.75 x 1 + 0.25 x 5
    EXPECT_FLOAT_EQ(landed[0], want) << "cluster_batch '" << counts << "'";
    EXPECT_FLOAT_EQ(landed[1], want) << "cluster_batch '" << counts << "'";
  }
}

// sync.cluster_ranks: clusters of different sizes (the scheduler's uneven shares). A cluster of 2 ranks with 2
// sequences each is one replica of 4 sequences, so 3 ranks as clusters "2,1" land on the parameters of 2 ranks
// whose clusters take 4 and 2 sequences: the leaders' whole-buffer exchange, its weights (2:1 by ranks) and the
// broadcast inside the larger cluster all count.
TEST(SyncClusterRanks, ClustersOfDifferentSizesMatchOneRankClustersWithTheirBatches) {
  train::Config uneven = diloco("cr_uneven", 9);
  uneven.train.global_batch = 6;
  uneven.sync.clusters = 0;
  uneven.sync.cluster_ranks = "2,1";
  train::Config ref = diloco("cr_ref", 9);
  ref.train.global_batch = 6;
  ref.sync.cluster_batch = "4,2";
  const Outcome got = train_with(uneven, 3), want = train_with(ref, 2);
  EXPECT_EQ(got.local_batches, (std::vector<int64_t>{2, 2, 2}));
  ASSERT_EQ(got.parameters.size(), want.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < want.parameters.size(); ++i)
    worst = std::max(worst, std::abs(double(got.parameters[i]) - want.parameters[i]));
  EXPECT_LE(worst, 1e-5) << "largest parameter difference";
  EXPECT_NEAR(got.val_loss, want.val_loss, 1e-4 * want.val_loss);
  // Without the weights the smaller cluster's sequences would count double: another result.
  train::Config unweighted = diloco("cr_unweighted", 9);
  unweighted.train.global_batch = 6;
  const Outcome other = train_with(unweighted, 2);
  double apart = 0;
  for (size_t i = 0; i < other.parameters.size(); ++i)
    apart = std::max(apart, std::abs(double(other.parameters[i]) - want.parameters[i]));
  EXPECT_GT(apart, 1e-4);
}

TEST(SyncClusterRanks, SizesMustAddUpAndRefuseZeroAndOtherModes) {
  EXPECT_EQ(train::sized_clusters(4, {3, 1}), (std::vector<int>{0, 0, 0, 1}));
  EXPECT_THROW(train::sized_clusters(4, {2, 1}), UsageError);
  EXPECT_THROW(train::sized_clusters(4, {std::numeric_limits<int64_t>::max(), 1}), UsageError) << "no overflow";
  EXPECT_THROW(train::parse_cluster_ranks("2,0"), UsageError);
  EXPECT_THROW(train::parse_cluster_ranks("2,"), UsageError);
  train::SyncConfig s;
  s.mode = train::SyncMode::DiLoCo;
  s.cluster_ranks = "2,1";
  EXPECT_NO_THROW(train::check_sync_config(s, 3, 1, 1, 0));
  EXPECT_THROW(train::check_sync_config(s, 3, 1, 1, 1), UsageError) << "ZeRO shards what the leaders exchange whole";
  EXPECT_THROW(train::check_sync_config(s, 4, 1, 1, 0), UsageError);
  train::Config c = crosstrain::testing::tiny_config("cr_modes");
  c.sync.cluster_ranks = "2,1";
  EXPECT_THROW(train::check_cluster_ranks(c), UsageError) << "sync mode has no clusters of its own";
}

TEST(SyncClusterBatch, UnevenSharesResumeBetweenOuterStepsLikeTheUninterruptedRun) {
  auto config = [](const std::string& tag) {
    train::Config c = diloco(tag);
    c.train.global_batch = 16;
    c.sync.cluster_batch = "12,4";
    return c;
  };
  Outcome want = train_with(config("cb_resume_ref"), 2);
  want.losses.erase(want.losses.begin(), want.losses.end() - 8);
  Outcome got = resumed_at(config("cb_resume"), 2, 4, config("cb_resume"), 2);  // H = 3: between outer steps
  expect_same(got, want, 1e-5, "diloco with cluster_batch 12,4 resumed at step 4");
}

TEST(SyncLayouts, DiLoCoWithPipelineAndTensorParallelInsideEachClusterMatchesWholeReplicas) {
  Outcome want = train_with(diloco("dl_whole"), 2);  // one rank per cluster
  Outcome got = train_with(split(diloco("dl_pp2tp2"), 2, 2), 8);
  expect_same_losses(got, want, 1e-4, "diloco, pp=2 x tp=2 in each of 2 clusters");
  EXPECT_EQ(got.last_row["sync_exchanges"].get<int64_t>(), want.last_row["sync_exchanges"].get<int64_t>());
  // Each rank sends only its shard: the 4 ranks of a replica together send what one whole replica sends.
  EXPECT_LT(got.last_row["wan_bytes"].get<int64_t>(), want.last_row["wan_bytes"].get<int64_t>());
}

TEST(SyncLayouts, DiLoCoWithZeroInsideEachClusterMatchesPlainDataParallelInside) {
  Outcome want = train_with(diloco("dl_z0"), 4);  // 2 clusters x 2 ranks
  for (int zero : {1, 2, 3}) {
    Outcome got = train_with(split(diloco("dl_z" + std::to_string(zero)), 1, 1, zero), 4);
    expect_same_losses(got, want, 1e-5, "diloco with ZeRO-" + std::to_string(zero) + " inside each cluster");
  }
}

TEST(SyncLayouts, GossipAndServerModesRunWithTensorParallelReplicas) {
  train::Config g = base("gossip_tp1", 12);
  g.sync.mode = train::SyncMode::Gossip;
  Outcome want = train_with(g, 2);
  g = base("gossip_tp2", 12);
  g.sync.mode = train::SyncMode::Gossip;
  Outcome got = train_with(split(g, 1, 2), 4);
  // Gossip pairs are fixed per round, so averaging shards equals averaging whole replicas.
  expect_same_losses(got, want, 1e-4, "gossip, tp=2 replicas");
  for (const std::string mode : {"async", "ssp"}) {
    train::Config c = split(base(mode + "_pp2", 12), 2, 1);
    c.sync.mode = train::parse_sync_mode(mode);
    Outcome r = train_with(c, 4);  // two replicas of two pipeline stages, asynchronous to each other
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << mode << " with pp=2 learns";
    EXPECT_GT(r.last_row["sync_exchanges"].get<int64_t>(), 0) << mode;
  }
}

// The Llama family through the same sync machinery: each rank exchanges its shards of the plan, whatever the family.
TEST(SyncLayouts, LlamaReplicasSplitInsideEachClusterMatchWholeOnes) {
  auto llama = [](train::Config c) {
    c.model.arch = models::ModelArch::Llama;
    return c;
  };
  Outcome want = train_with(llama(diloco("dl_llama_whole")), 2);
  Outcome got = train_with(split(llama(diloco("dl_llama_pp2tp2")), 2, 2), 8);
  expect_same_losses(got, want, 1e-4, "llama diloco, pp=2 x tp=2 in each of 2 clusters");
  EXPECT_LT(got.losses.back(), got.losses.front() - 0.5) << "llama diloco learns";
}

TEST(SyncResume, DiLoCoResumedAfterAnOuterStepContinuesLikeTheUninterruptedRun) {
  // The outer momentum is part of the state: without it the outer step after the resume would differ.
  train::Config c = diloco("dl_resume_ref");
  c.sync.outer_momentum = 0.9;
  Outcome want = train_with(c, 4);
  want.losses.erase(want.losses.begin(), want.losses.end() - 6);
  for (int zero : {0, 2}) {
    train::Config r = split(diloco("dl_resume_z" + std::to_string(zero)), 1, 1, zero);
    r.sync.outer_momentum = 0.9;
    Outcome got = resumed_at(r, 4, 6, r, 4);
    ASSERT_EQ(got.losses.size(), 6u);
    if (zero == 0)
      expect_same(got, want, 1e-5, "diloco resumed at step 6");  // also the final parameters
    else
      expect_same_losses(got, want, 1e-5, "diloco with ZeRO-2 resumed at step 6");
  }
}

TEST(SyncResume, DiLoCoCheckpointLoadsIntoAnotherLayout) {
  train::Config c = diloco("dl_relayout_ref");
  Outcome want = train_with(c, 2);
  train::Config first = diloco("dl_relayout");
  Outcome got = resumed_at(first, 2, 6, split(first, 1, 2), 4);  // resumed with tp=2 inside each cluster
  want.losses.erase(want.losses.begin(), want.losses.end() - 6);
  expect_same_losses(got, want, 1e-4, "diloco saved with tp=1, resumed with tp=2");
}

TEST(SyncResume, SspResumesWithTheClocksOfItsCheckpoint) {
  // The server's clocks start at the checkpoint's step: from 0 every worker would wait for a slowest one that is
  // "steps - 1" behind, and time out.
  train::Config c = base("ssp_resume", 10);
  c.sync.mode = train::SyncMode::Ssp;
  c.sync.staleness = 1;
  c.comm.timeout_s = 10;
  Outcome got = resumed_at(c, 2, 5, c, 2);
  EXPECT_EQ(got.losses.size(), 5u);
}

TEST(SyncResume, DiLoCoResumedBetweenOuterStepsKeepsEachClustersCopyAndTheCommonAnchor) {
  // Step 4 lies between the outer steps at 3 and 6: the clusters' parameters and inner moments differ there
  // (a copy per cluster) while the outer parameters they started from are common (saved once per copy too).
  train::Config c = diloco("dl_mid_ref");
  Outcome want = train_with(c, 4);
  want.losses.erase(want.losses.begin(), want.losses.end() - 8);
  train::Config r = diloco("dl_mid");
  Outcome got = resumed_at(r, 4, 4, r, 4);
  expect_same(got, want, 1e-5, "diloco resumed at step 4 (between outer steps)");
}

TEST(Precision, Bf16RunsInEveryLayout) {
  // Replicated AdamW keeps fp32 master weights; pipelines pass bf16 activations.
  Outcome fp32 = train_with(base("bf16_ref", 12), 2);
  struct Layout {
    int pp, tp, zero;
  };
  for (Layout l : {Layout{1, 1, 0}, Layout{2, 1, 0}, Layout{1, 2, 0}, Layout{2, 1, 1}}) {
    train::Config c = split(base("bf16_pp" + std::to_string(l.pp) + "_tp" + std::to_string(l.tp) + "_z" +
                                 std::to_string(l.zero), 12),
                            l.pp, l.tp, l.zero);
    c.parallel.dp = 2;
    c.train.precision = "bf16";
    Outcome r = train_with(c, 2 * l.pp * l.tp);
    const std::string what = "bf16 pp=" + std::to_string(l.pp) + " tp=" + std::to_string(l.tp) +
                             " zero=" + std::to_string(l.zero);
    ASSERT_EQ(r.losses.size(), fp32.losses.size()) << what;
    EXPECT_NEAR(r.losses.back(), fp32.losses.back(), 0.03 * fp32.losses.back()) << what;
    EXPECT_LT(r.losses.back(), r.losses.front() - 0.5) << what << " learns";
  }
}

// ---- accounting ---------------------------------------------------------------------------------------------

// Only bytes that cross a cluster boundary are wide-area bytes: plain data parallel on one host sends none, the
// same run declared as two clusters sends its gradient all-reduce across them.
TEST(SyncAccounting, FlatSyncCountsWideAreaBytesOnlyAcrossClusters) {
  train::Config one = base("acct_one_cluster", 4);
  Outcome local = train_with(one, 2);
  EXPECT_EQ(local.last_row["wan_bytes"].get<int64_t>(), 0);
  train::Config two = base("acct_two_clusters", 4);
  two.sync.clusters = 2;
  Outcome across = train_with(two, 2);
  EXPECT_GT(across.last_row["wan_bytes"].get<int64_t>(), 0);
}

// Ctrl-C in streaming DiLoCo stops after an outer step, where a fragment's exchange has only just started (it
// lands a step later): the stop completes it before saving, so both clusters' saved copies of that fragment hold
// the same new outer parameters instead of each its own inner ones.
TEST(SyncStop, StreamingDiLoCoLandsTheExchangeInFlightBeforeItSaves) {
  train::Config c = base("stop_streaming", 1000);
  c.sync.mode = train::SyncMode::DiLoCo;
  c.sync.inner_steps = 6;
  c.sync.fragments = 3;  // fragments exchange at steps 2, 4 and 6, each landing one step later
  c.sync.overlap_steps = 1;
  c.sync.clusters = 2;
  c.train.checkpoint_every = 0;
  std::vector<int64_t> stopped(2, -2);
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    train::Trainer trainer(c, world);
    train::TrainOptions options;
    options.quiet = true;
    options.stop_requested = [] { return true; };  // heard at the first outer step, 6
    stopped[world.rank()] = trainer.run(options).stopped_after;
  });
  ASSERT_EQ(stopped, (std::vector<int64_t>{6, 6}));
  checkpoint::CheckpointReader reader(c.run.dir + "/checkpoints/step_00000006");
  int same = 0, different = 0;
  for (const auto& name : reader.tensors()) {
    if (name.find('#') != std::string::npos || !reader.has(name + "#copy1")) continue;
    auto whole = [](const std::string&, const at::Tensor& full, int, int) { return full; };  // tp = 1
    const at::Tensor a = reader.read_full(name, whole), b = reader.read_full(name + "#copy1", whole);
    (a.equal(b) ? same : different) += 1;
  }
  EXPECT_GT(same, 0) << "the fragment exchanged at step 6 was saved before its outer step landed";
  EXPECT_GT(different, 0) << "the other fragments took inner steps since they landed";
}

// async Ctrl-C (HeardStop): a stop asked on one worker reaches the other in the reply to its next push, and no
// reply carries one before anybody asked.
TEST(ParameterServerStop, AStopAskedOnOneWorkerReachesTheOtherInItsNextReply) {
  std::vector<std::vector<bool>> heard(2);
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    auto group = world.split({0, 1});
    at::Tensor params = at::zeros({10});
    at::Tensor delta = at::zeros({10});
    train::ParameterServer ps(*group, params, comm::Millis(10000));
    auto& mine = heard[world.rank()];
    mine.push_back(ps.push_pull(delta, params, 1).stop);
    world.barrier()->wait();
    if (world.rank() == 0) {
      ps.ask_to_stop();
      mine.push_back(ps.push_pull(delta, params, 2).stop);
    }
    world.barrier()->wait();
    if (world.rank() == 1) mine.push_back(ps.push_pull(delta, params, 2).stop);
    world.barrier()->wait();
    ps.finish();
  });
  EXPECT_EQ(heard[0], (std::vector<bool>{false, true}));
  EXPECT_EQ(heard[1], (std::vector<bool>{false, true}));
}

// A sync strategy names its exchange in errors ("sync: diloco outer step failed on world rank 2 at step 7"), but a
// CommError keeps its type: elastic training recovers from it (a GenerationEnded inside DiLoCo's outer exchange),
// and it names rank, operation, peer and step already. Before, it became a plain Error and the rank died.
TEST(SyncErrors, ACommErrorFromAnExchangeKeepsItsTypeAndOtherErrorsGetTheExchangesName) {
  using train::sync_detail::with_context;
  CommContext where;
  where.rank = 2;
  where.op = "allreduce";
  EXPECT_THROW(with_context("diloco outer step", 2, 7, [&]() -> int { throw CommError(where, "a member failed"); }),
               CommError);
  try {
    with_context("diloco outer step", 2, 7, []() -> int { throw Error("a bad buffer"); });
    FAIL() << "no error";
  } catch (const CommError&) {
    FAIL() << "a plain error became a CommError";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sync: diloco outer step failed on world rank 2 at step 7: a bad buffer"),
              std::string::npos)
        << e.what();
  }
}
