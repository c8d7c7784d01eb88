// DLRM in parameter-server mode (dlrm.mode = "ps"): on one rank with fresh rows (no cache) it is the sharded
// run exactly; on two workers with bounded staleness and a cache it learns; tables in memory-mapped files far
// beyond the memory budget still train. Ranks are threads; files are real.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "dlrm_fixture.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

// The parity tests' model (dlrm_fixture.h) with its tables on the parameter server.
train::Config ps_config(const std::string& tag) {
  train::Config c = crosstrain::testing::dlrm_test_config("ps-" + tag);
  c.dlrm.tables = "4000,900,60";
  c.dlrm.multi_hot = 2;
  c.dlrm.signal = 2;
  c.dlrm.mode = recsys::DlrmMode::ParameterServer;
  c.sync.mode = train::SyncMode::Ssp;
  c.sync.staleness = 0;
  c.train.global_batch = 128;
  c.train.eval_batches = 4;
  return c;
}

train::DlrmResult train_on(int world, const train::Config& c) {
  auto r = crosstrain::testing::train_dlrm(world, c);
  fs::remove_all(c.run.dir);
  return r;
}

}  // namespace

TEST(DlrmPs, OneRankWithFreshRowsIsTheShardedRun) {
  auto ps = ps_config("fresh");
  auto sharded = ps;
  sharded.dlrm.mode = recsys::DlrmMode::Sharded;
  sharded.sync.mode = train::SyncMode::Sync;
  const auto a = train_on(1, ps), b = train_on(1, sharded);
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, 1e-5) << i;
  for (size_t t = 0; t < a.tables.size(); ++t)
    EXPECT_LT((a.tables[t] - b.tables[t]).abs().max().item<double>(), 1e-5) << "table " << t;
}

TEST(DlrmPs, TwoWorkersWithStaleCachedRowsLearn) {
  auto c = ps_config("stale");
  c.sync.staleness = 2;
  c.dlrm.cache_rows = 500;
  c.train.steps = 60;
  const auto r = train_on(2, c);
  double head = 0, tail = 0;
  for (int i = 0; i < 10; ++i) head += r.steps[i].loss, tail += r.steps[r.steps.size() - 1 - i].loss;
  EXPECT_LT(tail, head * 0.95) << "the loss falls";
  EXPECT_GT(r.val_auc, 0.6);
  EXPECT_GT(r.steps.back().exchange_bytes, 0);
  // The parameter server's pulls and pushes count as the step's communication, though they bypass the recorder.
  double comm = 0;
  for (const auto& s : r.steps) comm += s.comm_time_s;
  EXPECT_GT(comm, 0);
}

TEST(DlrmPs, MappedTablesFarBeyondTheBudgetTrain) {
  auto c = ps_config("mmap");
  c.dlrm.tables = "200000,200000";  // 2 x 200k x 8 floats + row state: 13.6 MB, 6.8 MB per rank
  c.dlrm.ps_storage = recsys::TableStorageKind::Mmap;
  c.dlrm.memory_budget_mb = 1;
  c.dlrm.cache_rows = 2000;  // 64 KB of cache
  c.sync.staleness = 1;
  const auto r = train_on(2, c);
  EXPECT_TRUE(r.tables_in_files);
  EXPECT_GT(r.table_bytes_this_rank, 4 * (int64_t{1} << 20)) << "more than 4x the budget held by one rank";
  EXPECT_LT(r.steps.back().loss, r.steps.front().loss);
}
