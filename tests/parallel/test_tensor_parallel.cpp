// Tensor and sequence parallelism against the single-device GPT: same loss, and each rank's gradient shards
// equal the matching slices of the reference gradients. Ranks are threads (in-process back end).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/parallel/tensor_parallel.h"

using namespace crosstrain;

namespace {

models::GPTConfig small() {
  models::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 64;
  return c;
}

void check_tp(int tp, bool sequence_parallel) {
  auto config = small();
  auto gen = at::detail::createCPUGenerator(11);
  auto x = torch::randint(0, config.vocab_size, {3, config.block_size}, gen);
  auto y = torch::randint(0, config.vocab_size, {3, config.block_size}, gen);
  models::GPT reference(config, 7);
  auto ref_loss = reference->loss(x, y);
  ref_loss.backward();
  auto ref = reference->named_parameters();

  comm::FakeWorld::run(tp, [&](comm::Communicator& world) {
    parallel::Mesh mesh(world, parallel::MeshShape{1, 1, tp});
    models::TensorParallelContext ctx{mesh.group(parallel::Axis::TP), mesh.index(parallel::Axis::TP), tp,
                                      sequence_parallel};
    models::GPTStage stage(config, models::StageSpec{0, config.n_layer, true, true}, ctx, 7);
    auto loss = stage->loss(x, y);
    loss.backward();
    // Replicated parameters see only a sequence slice with sequence parallelism: sum their gradients.
    for (auto& p : stage->partial_gradient_parameters()) {
      auto g = p.grad().contiguous();
      mesh.group(parallel::Axis::TP)->all_reduce(g, comm::ReduceOp::Sum)->wait();
      p.mutable_grad().copy_(g);
    }
    EXPECT_NEAR(loss.item<double>(), ref_loss.item<double>(), 1e-4 * ref_loss.item<double>());
    EXPECT_EQ(stage->named_shards().size(), ref.size());
    for (const auto& [name, shard] : stage->named_shards()) {
      auto want = models::shard_of(name, ref[name].grad(), config, ctx.rank, tp);
      ASSERT_EQ(shard.sizes(), want.sizes()) << name;
      EXPECT_TRUE(torch::allclose(shard.grad(), want, 1e-4, 1e-5))
          << name << " rank " << ctx.rank << " max diff " << (shard.grad() - want).abs().max().item<float>();
    }
  });
}

}  // namespace

TEST(TensorParallel, Tp2MatchesSingleDevice) { check_tp(2, false); }
TEST(TensorParallel, Tp4MatchesSingleDevice) { check_tp(4, false); }
TEST(TensorParallel, Tp2SequenceParallelMatchesSingleDevice) { check_tp(2, true); }
TEST(TensorParallel, Tp1IsTheSingleDeviceModel) { check_tp(1, false); }

TEST(TensorParallel, MappingsAreConjugate) {
  // forward and backward of each mapping on 3 ranks, against hand-computed values.
  comm::FakeWorld::run(3, [](comm::Communicator& c) {
    const double r = c.rank();
    auto x = torch::full({2, 3, 6}, r + 1, torch::requires_grad());
    auto y = parallel::tp::reduce_from_region(x, &c);  // sum over ranks: 6
    EXPECT_EQ(y[0][0][0].item<double>(), 6.0);
    y.sum().backward();
    EXPECT_EQ(x.grad()[0][0][0].item<double>(), 1.0);  // identity backward

    auto a = torch::full({2, 3, 6}, r + 1, torch::requires_grad());
    parallel::tp::copy_to_region(a, &c).sum().backward();  // all-reduce backward: 3 ranks x 1
    EXPECT_EQ(a.grad()[1][2][5].item<double>(), 3.0);

    auto b = torch::arange(6, torch::kFloat).view({1, 1, 6}).requires_grad_(true);
    auto s = parallel::tp::scatter_to_region(b, &c);  // last dim 6 -> 2 per rank
    EXPECT_EQ(s[0][0][0].item<float>(), 2.0f * c.rank());
    (s * (r + 1)).sum().backward();  // gather backward puts each rank's grad in its slice
    EXPECT_EQ(b.grad()[0][0][0].item<float>(), 1.0f);
    EXPECT_EQ(b.grad()[0][0][5].item<float>(), 3.0f);

    auto q = torch::full({2, 2, 4}, r, torch::requires_grad());  // sequence 2 per rank -> 6
    auto g = parallel::tp::gather_from_sequence(q, &c);
    EXPECT_EQ(g.size(1), 6);
    EXPECT_EQ(g[1][4][0].item<float>(), 2.0f);
    g.sum().backward();  // reduce-scatter backward: 3 ranks x 1
    EXPECT_EQ(q.grad()[0][0][0].item<float>(), 3.0f);

    auto w = torch::full({1, 6, 2}, r + 1, torch::requires_grad());
    auto rs = parallel::tp::reduce_scatter_to_sequence(w, &c);
    EXPECT_EQ(rs.size(1), 2);
    EXPECT_EQ(rs[0][0][0].item<float>(), 6.0f);
    rs.sum().backward();
    EXPECT_EQ(w.grad()[0][5][1].item<float>(), 1.0f);
  });
  // A group of one (null) is the identity.
  auto x = torch::ones({2, 2});
  EXPECT_TRUE(parallel::tp::reduce_from_region(x, nullptr).is_same(x));
}

TEST(TensorParallel, VocabParallelCrossEntropyMatches) {
  auto gen = at::detail::createCPUGenerator(3);
  auto logits = torch::randn({5, 12}, gen);
  auto targets = torch::randint(0, 12, {5}, gen);
  auto full = logits.clone().requires_grad_(true);
  auto want = torch::nn::functional::cross_entropy(full, targets);
  want.backward();
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto mine = logits.chunk(4, 1)[c.rank()].clone().requires_grad_(true);
    auto loss = parallel::tp::vocab_parallel_cross_entropy(mine, targets, c.rank() * 3, &c);
    EXPECT_NEAR(loss.item<double>(), want.item<double>(), 1e-5);
    loss.backward();
    EXPECT_TRUE(torch::allclose(mine.grad(), full.grad().chunk(4, 1)[c.rank()], 1e-5, 1e-6));
  });
}

TEST(PipelinePartition, BalancesBlocksAndErrors) {
  EXPECT_EQ(models::partition_layers(8, 2, 0, 0), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(models::partition_layers(8, 4, 0, 0), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  // A heavy head pushes blocks towards the first stage.
  auto b = models::partition_layers(8, 2, 0, 2.0);
  EXPECT_EQ(b, (std::vector<int64_t>{0, 5, 8}));
  EXPECT_EQ(models::partition_layers(3, 3, 5, 5), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_THROW(models::partition_layers(2, 3, 0, 0), UsageError);
  auto c = small();
  EXPECT_THROW(models::check_parallel_plan(c, 3, false, 1), UsageError);  // 4 heads over 3
  EXPECT_THROW(models::check_parallel_plan(c, 1, false, 3), UsageError);  // 3 stages, 2 layers
  EXPECT_NO_THROW(models::check_parallel_plan(c, 2, true, 2));
}

TEST(GPTParallelPlan, CoversTheSingleDeviceGPTInItsParameterOrder) {
  auto config = small();
  models::GPT full(config, 7);
  models::ParallelPlan plan(config);
  auto params = full->named_parameters();
  ASSERT_EQ(params.size(), plan.parameters().size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& entry = plan.parameters()[i];
    EXPECT_EQ(params[i].key(), entry.name);
    EXPECT_EQ(params[i].value().sizes().vec(), entry.shape) << entry.name;
  }
  // c_attn's shard: this rank's heads of each of q, k and v.
  auto w = params["h.0.attn.c_attn.weight"];
  auto parts = w.chunk(3, 0);
  auto want = torch::cat({parts[0].chunk(2, 0)[1], parts[1].chunk(2, 0)[1], parts[2].chunk(2, 0)[1]}, 0);
  EXPECT_TRUE(torch::equal(models::shard_of("h.0.attn.c_attn.weight", w, config, 1, 2), want));
  auto proj = params["h.1.mlp.c_proj.weight"];
  EXPECT_TRUE(torch::equal(models::shard_of(plan, "h.1.mlp.c_proj.weight", proj, 1, 4), proj.chunk(4, 1)[1]));
}

TEST(GPTStage, HoldsTheSingleDeviceBlocksUnderPlainNames) {
  auto config = small();
  models::GPT full(config, 7);
  models::StageSpec spec{1, 2, false, true};
  models::GPTStage stage(config, spec, models::TensorParallelContext{}, 7);
  std::vector<std::string> names;
  for (const auto& item : stage->named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, stage->plan().stage_parameters(spec));
  EXPECT_EQ(stage->named_shards().size(), names.size());
  EXPECT_TRUE(stage->partial_gradient_parameters().empty());
  EXPECT_FALSE(stage->is_replicated("h.1.ln_1.weight"));  // no tensor-parallel group
  // The stage's block is the model's block: same forward, bit for bit.
  auto x = torch::randn({2, config.block_size, config.n_embd}, at::detail::createCPUGenerator(5));
  auto want = full->h[1]->as<models::Block>()->forward(x);
  EXPECT_TRUE(torch::equal(stage->forward(x), want));
  auto unit_names = stage->unit_names();
  ASSERT_EQ(unit_names.size(), 2u);
  EXPECT_EQ(unit_names.back(), (std::vector<std::string>{"ln_f.weight", "ln_f.bias", "lm_head.weight"}));
}

TEST(GPTInit, GPT2SchemeFromTheSeedAlone) {
  // The scheme written out by parameter name, each parameter drawn from its own generator (seed and name).
  auto config = small();
  models::GPT model(config, 7);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    auto has = [&](const std::string& part) { return name.find(part) != std::string::npos; };
    auto want = torch::empty_like(item.value());
    if (has("ln_")) {
      has(".weight") ? want.fill_(1.0) : want.zero_();
    } else if (has(".bias")) {
      want.zero_();
    } else {
      auto gen = at::detail::createCPUGenerator(models::parameter_seed(7, name));
      want.normal_(0.0, has("c_proj.weight") ? residual_std : 0.02, gen);
    }
    EXPECT_TRUE(torch::equal(item.value(), want)) << name;
  }
  // Another seed, another model; the same name under another seed, another stream.
  models::GPT other(config, 8);
  const std::string fc = "h.0.mlp.c_fc.weight";
  EXPECT_FALSE(torch::equal(other->named_parameters()[fc], model->named_parameters()[fc]));
  EXPECT_NE(models::parameter_seed(7, "wte.weight"), models::parameter_seed(8, "wte.weight"));
  EXPECT_NE(models::parameter_seed(7, "h.0.mlp.c_fc.weight"), models::parameter_seed(7, "h.1.mlp.c_fc.weight"));
}

// A replica's group (its losses and gradient norm are summed there) is its tensor-parallel group when there are no
// pipeline stages: no group of its own to form, which an elastic generation pays for across a wide-area link. It
// still sums over exactly the replica's ranks.
TEST(MeshGroups, AReplicaWithoutPipelineStagesIsItsTensorParallelGroup) {
  comm::FakeWorld::run(4, [](comm::Communicator& world) {
    parallel::Mesh mesh(world, parallel::MeshShape{1, 2, 2});
    EXPECT_EQ(mesh.replica_group(), mesh.group(parallel::Axis::TP));
    at::Tensor t = at::full({1}, static_cast<double>(world.rank()));
    mesh.replica_group()->all_reduce(t, comm::ReduceOp::Sum)->wait();
    const int first = world.rank() / 2 * 2;  // ranks {0,1} and {2,3}
    EXPECT_EQ(t.item<double>(), first + first + 1);
  });
  comm::FakeWorld::run(4, [](comm::Communicator& world) {
    parallel::Mesh mesh(world, parallel::MeshShape{2, 2, 1});
    ASSERT_NE(mesh.replica_group(), nullptr);
    EXPECT_NE(mesh.replica_group(), mesh.group(parallel::Axis::PP));  // with stages, a group of its own
    EXPECT_EQ(mesh.replica_group()->size(), 2);
  });
}
