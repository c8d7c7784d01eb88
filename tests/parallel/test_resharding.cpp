// Distributed checkpoints reload into any layout: a run saves at step 5 in one layout, another layout resumes
// from that checkpoint and must continue with the same losses as the uninterrupted run (steps 6-10, within
// 1e-4 relative: different layouts sum in different orders). Ranks are threads; files are real.
#include <gtest/gtest.h>

#include <filesystem>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int dp = 1, pp = 1, tp = 1, zero = 0, dp_shard = 0;
  std::string text() const {
    return "dp" + std::to_string(dp) + "_pp" + std::to_string(pp) + "_tp" + std::to_string(tp) + "_z" + std::to_string(zero) +
           (dp_shard > 0 ? "_shard" + std::to_string(dp_shard) : "");
  }
};

train::Config config_for(const Layout& l, const std::string& dir) {
  auto c = crosstrain::testing::tiny_config("reshard");
  c.run.dir = dir;
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_embd = 32;
  c.model.block_size = 16;
  c.train.steps = 10;
  c.train.checkpoint_every = 5;
  c.train.keep_checkpoints = 0;
  c.parallel.dp = l.dp;
  c.parallel.pp = l.pp;
  c.parallel.tp = l.tp;
  c.parallel.zero = l.zero;
  c.parallel.dp_shard = l.dp_shard;
  return c;
}

std::vector<double> train(const Layout& l, const std::string& dir, bool resume) {
  auto c = config_for(l, dir);
  std::vector<double> losses;
  comm::FakeWorld::run(l.dp * l.pp * l.tp, [&](comm::Communicator& comm) {
    train::Trainer trainer(c, comm);
    train::TrainOptions o;
    o.quiet = true;
    o.resume = resume;
    auto r = trainer.run(o);
    if (comm.rank() == 0)
      for (const auto& s : r.steps) losses.push_back(s.loss);
  });
  return losses;
}

class Resharding : public ::testing::TestWithParam<std::pair<Layout, Layout>> {};

TEST_P(Resharding, ResumedRunContinuesLikeTheUninterruptedOne) {
  const auto& [from, to] = GetParam();
  const std::string base = (fs::path(::testing::TempDir()) / ("reshard_" + from.text() + "_to_" + to.text())).string();
  fs::remove_all(base);
  auto full = train(from, base + "/full", false);
  ASSERT_EQ(full.size(), 10u);
  // The interrupted run: only the step-5 checkpoint survived.
  fs::create_directories(base + "/part/checkpoints");
  fs::copy(base + "/full/checkpoints/step_00000005", base + "/part/checkpoints/step_00000005", fs::copy_options::recursive);
  auto resumed = train(to, base + "/part", true);
  ASSERT_EQ(resumed.size(), 5u);
  for (size_t i = 0; i < 5; ++i)
    EXPECT_NEAR(resumed[i], full[5 + i], 1e-4 * std::abs(full[5 + i])) << "step " << 6 + i;
  // The resumed run's own checkpoint is complete and readable.
  checkpoint::CheckpointReader reader(base + "/part/checkpoints/step_00000010");
  EXPECT_EQ(reader.step(), 10);
  EXPECT_EQ(reader.info()["layout"]["zero"].get<int>(), to.zero);
}

Layout L(int dp, int pp, int tp, int zero, int dp_shard = 0) { return Layout{dp, pp, tp, zero, dp_shard}; }

INSTANTIATE_TEST_SUITE_P(
    Matrix, Resharding,
    ::testing::Values(std::make_pair(L(2, 1, 1, 3), L(1, 1, 1, 0)), std::make_pair(L(1, 1, 1, 0), L(2, 1, 1, 3)),
                      std::make_pair(L(4, 1, 1, 1), L(2, 1, 2, 0)), std::make_pair(L(2, 1, 2, 0), L(4, 1, 1, 1)),
                      std::make_pair(L(1, 2, 2, 0), L(4, 1, 1, 2)), std::make_pair(L(4, 1, 1, 2), L(1, 2, 2, 0)),
                      std::make_pair(L(2, 1, 2, 3), L(1, 2, 1, 1)),
                      // HSDP: only the first copy writes; any layout reads it back, and HSDP reads any layout.
                      std::make_pair(L(4, 1, 1, 2, 2), L(1, 1, 1, 0)), std::make_pair(L(2, 1, 2, 0), L(4, 1, 1, 3, 2))),
    [](const auto& info) { return info.param.first.text() + "_to_" + info.param.second.text(); });

}  // namespace
