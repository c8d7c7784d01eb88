// DLRM parity: every sharding scheme (table-, row-, column-wise) on 2 and 4 ranks gives the losses and the
// updated table rows of one process over 20 steps; one process matches an independent plain-libtorch DLRM
// step (full tables as dense parameters, row-wise Adagrad written out from its formula); a run stopped on 4
// ranks resumes on 2 (another sharding) with the losses of the run that never stopped. Ranks are threads.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/data/ctr.h"
#include "crosstrain/recsys/dlrm.h"
#include "crosstrain/recsys/embedding_table.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "dlrm_fixture.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

using crosstrain::testing::dlrm_test_config;
using crosstrain::testing::train_dlrm;

void expect_same_run(const train::DlrmResult& a, const train::DlrmResult& b, const std::string& what,
                     double tol = 1e-5) {
  ASSERT_EQ(a.steps.size(), b.steps.size()) << what;
  for (size_t i = 0; i < a.steps.size(); ++i)
    EXPECT_NEAR(a.steps[i].loss, b.steps[i].loss, tol) << what << ", step " << a.steps[i].step;
  ASSERT_EQ(a.tables.size(), b.tables.size());
  for (size_t t = 0; t < a.tables.size(); ++t)
    EXPECT_LT((a.tables[t] - b.tables[t]).abs().max().item<double>(), tol) << what << ", table " << t;
  for (size_t i = 0; i < a.dense.size(); ++i)
    EXPECT_LT((a.dense[i] - b.dense[i]).abs().max().item<double>(), 1e-4) << what << ", dense " << i;
}

// Rows that moved during training (against the initial table): the updates are real, not a zero-gradient no-op.
int64_t rows_changed(const at::Tensor& table, int t, uint64_t seed) {
  at::Tensor init = at::empty_like(table);
  recsys::init_rows(init, seed, t, table.size(0), 0, 0);
  return (table - init).abs().amax(1).gt(1e-7).sum().item<int64_t>();
}

}  // namespace

class DlrmShardings : public ::testing::TestWithParam<std::string> {};

TEST_P(DlrmShardings, TwoAndFourRanksMatchOneProcess) {
  auto c = dlrm_test_config("parity-" + GetParam());
  const auto one = train_dlrm(1, c);
  ASSERT_EQ(one.steps.size(), 20u);
  EXPECT_LT(one.steps.back().loss, one.steps.front().loss) << "the model learns";
  EXPECT_GT(rows_changed(one.tables[0], 0, c.run.seed), 100) << "table 0's touched rows were updated";
  c.dlrm.sharding = GetParam();
  for (int world : {2, 4}) {
    const auto many = train_dlrm(world, c);
    for (const auto& p : many.placements) EXPECT_EQ(p.rfind(GetParam() + ":", 0), 0u) << p;
    expect_same_run(one, many, GetParam() + "-wise on " + std::to_string(world) + " ranks");
    EXPECT_GT(many.steps.back().exchange_bytes, 0) << "lookups crossed ranks";
  }
  fs::remove_all(c.run.dir);
}

INSTANTIATE_TEST_SUITE_P(EachScheme, DlrmShardings, ::testing::Values("table", "row", "column"));

TEST(Dlrm, AdamAndMeanPoolingMatchOneProcessOnAMixOfSchemes) {
  auto c = dlrm_test_config("adam");
  c.dlrm.sparse_optimizer = "adam";
  c.dlrm.sparse_lr = 0.01;
  c.dlrm.pooling = recsys::Pooling::Mean;
  const auto one = train_dlrm(1, c);
  c.dlrm.sharding = "row,column,table,table";
  expect_same_run(one, train_dlrm(4, c), "adam, mixed sharding, 4 ranks");
  fs::remove_all(c.run.dir);
}

// One step of plain libtorch: the tables are whole dense parameters, embedding_bag pools them, autograd gives
// their (dense) gradients, and row-wise Adagrad is applied by its formula to the rows the batch touched.
TEST(Dlrm, OneProcessMatchesAPlainLibtorchReference) {
  auto c = dlrm_test_config("reference");
  c.train.steps = 3;
  const auto ours = train_dlrm(1, c);

  const auto rows = c.dlrm.table_rows();
  std::vector<torch::Tensor> tables;
  for (size_t t = 0; t < rows.size(); ++t) {
    tables.push_back(torch::empty({rows[t], c.dlrm.embedding_dim}));
    recsys::init_rows(tables.back(), c.run.seed, static_cast<int>(t), rows[t], 0, 0);
    tables.back().requires_grad_(true);
  }
  std::vector<torch::Tensor> adagrad_sum;
  for (int64_t r : rows) adagrad_sum.push_back(torch::zeros({r}));
  recsys::DlrmDense dense(c.dlrm, c.run.seed);
  torch::optim::Adam adam(dense->parameters(), torch::optim::AdamOptions(c.train.lr).betas({0.9, 0.95}).eps(1e-8));
  data::SyntheticCtrConfig sc;
  sc.schema.dense_features = c.dlrm.dense_features;
  sc.schema.table_rows = rows;
  sc.schema.multi_hot = c.dlrm.multi_hot;
  sc.seed = c.run.seed;
  sc.zipf_exponent = c.dlrm.zipf;
  sc.signal = c.dlrm.signal;
  sc.click_rate = c.dlrm.click_rate;
  auto source = data::make_synthetic_ctr(sc);
  for (int64_t step = 1; step <= c.train.steps; ++step) {
    auto b = source->train_batch((step - 1) * c.train.global_batch, c.train.global_batch);
    std::vector<torch::Tensor> pooled;
    std::vector<torch::Tensor> ids;
    for (size_t t = 0; t < rows.size(); ++t) {
      ids.push_back(torch::tensor(b.ids[t], torch::kLong));
      pooled.push_back(std::get<0>(torch::embedding_bag(tables[t], ids[t], torch::tensor(b.offsets[t], torch::kLong),
                                                        false, 0, false, {}, true)));
    }
    const auto x = torch::from_blob(b.dense.data(), {b.size, c.dlrm.dense_features}).clone();
    const auto y = torch::from_blob(b.labels.data(), {b.size}).clone();
    for (auto& t : tables)
      if (t.grad().defined()) t.mutable_grad().zero_();
    adam.zero_grad();
    auto loss = torch::binary_cross_entropy_with_logits(dense->forward(x, pooled), y);
    loss.backward();
    EXPECT_NEAR(loss.item<double>(), ours.steps[step - 1].loss, 1e-5) << "step " << step;
    adam.step();
    torch::NoGradGuard no_grad;
    for (size_t t = 0; t < rows.size(); ++t) {
      const auto touched = std::get<0>(torch::_unique2(ids[t]));
      const auto g = tables[t].grad().index_select(0, touched);
      const auto sum = adagrad_sum[t].index_select(0, touched) + g.pow(2).mean(1);
      adagrad_sum[t].index_copy_(0, touched, sum);
      tables[t].index_copy_(0, touched,
                            tables[t].index_select(0, touched) - c.dlrm.sparse_lr * g / (sum.sqrt() + 1e-8).unsqueeze(1));
    }
  }
  for (size_t t = 0; t < rows.size(); ++t)
    EXPECT_LT((tables[t].detach() - ours.tables[t]).abs().max().item<double>(), 1e-5) << "table " << t;
  fs::remove_all(c.run.dir);
}

TEST(Dlrm, StoppedOnFourRanksResumesOnTwoExactly) {
  auto c = dlrm_test_config("reshard");
  c.dlrm.tables = "5000,3000,64,40";  // auto: 4 ranks and 2 ranks place these differently
  const auto whole = train_dlrm(4, c);
  auto first = c;
  first.train.steps = 10;
  const auto head = train_dlrm(4, first);
  ASSERT_TRUE(fs::exists(c.run.dir + "/checkpoints/step_00000010/manifest.json"));
  c.dlrm.sharding = "row,column,table,row";  // and a forced, different layout on 2 ranks
  const auto tail = train_dlrm(2, c, /*resume=*/true);
  ASSERT_EQ(tail.steps.size(), 10u);
  EXPECT_EQ(tail.steps.front().step, 11);
  for (size_t i = 0; i < 10; ++i) {
    EXPECT_NEAR(head.steps[i].loss, whole.steps[i].loss, 1e-5);
    EXPECT_NEAR(tail.steps[i].loss, whole.steps[10 + i].loss, 1e-5) << "step " << tail.steps[i].step;
  }
  for (size_t t = 0; t < whole.tables.size(); ++t)
    EXPECT_LT((tail.tables[t] - whole.tables[t]).abs().max().item<double>(), 1e-5) << "table " << t;
  fs::remove_all(c.run.dir);
}
