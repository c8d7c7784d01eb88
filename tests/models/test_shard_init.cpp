// Shard-only initialisation (issue 15, item 3): every stage and tensor-parallel rank draws exactly its shards of
// the single-device model of the seed, bit for bit, without building that model; and ZeRO-3's peak memory above
// what the process held before the model was built stays below plain data parallel's. Memory is counted at the
// CPU allocator (core/memory_counter.h), not RSS: exact and free of the heap's caching. The counter is
// process-wide and ranks are threads, so a figure is the sum over the ranks.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <set>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/core/memory_counter.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/models/parallelize.h"
#include "crosstrain/parallel/mesh.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

models::GPTConfig config_of(int64_t layers, int64_t heads, int64_t width, int64_t context, int64_t vocab) {
  models::GPTConfig c;
  c.n_layer = layers;
  c.n_head = heads;
  c.n_embd = width;
  c.block_size = context;
  c.vocab_size = vocab;
  return c;
}

int64_t bytes_of(const std::vector<torch::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace

TEST(ShardInit, EveryStageAtTp2Pp2HoldsTheShardsOfTheSingleDeviceModel) {
  const auto config = config_of(4, 4, 64, 16, 64);
  models::GPT full(config, 21);
  auto reference = full->named_parameters();
  std::set<std::string> covered;
  const std::vector<models::StageSpec> stages{{0, 2, true, false}, {2, 4, false, true}};
  for (const auto& spec : stages)
    for (int r = 0; r < 2; ++r) {
      models::GPTStage stage(config, spec, models::TensorParallelContext{nullptr, r, 2, false}, 21);
      for (const auto& [name, shard] : stage->named_shards()) {
        auto want = models::shard_of(name, reference[name], config, r, 2);
        ASSERT_EQ(shard.sizes(), want.sizes()) << name;
        EXPECT_TRUE(torch::equal(shard, want)) << name << " on tp rank " << r;
        covered.insert(name);
      }
    }
  EXPECT_EQ(covered.size(), reference.size());
  // One stage of one rank is the single-device model itself.
  models::GPTStage whole(config, models::StageSpec{0, 4, true, true}, models::TensorParallelContext{}, 21);
  for (const auto& [name, p] : whole->named_shards()) EXPECT_TRUE(torch::equal(p, reference[name])) << name;
  // And the values depend on the seed.
  models::GPTStage other(config, models::StageSpec{0, 4, true, true}, models::TensorParallelContext{}, 22);
  EXPECT_FALSE(torch::equal(other->named_shards().at("h.1.attn.c_attn.weight"), reference["h.1.attn.c_attn.weight"]));
}

TEST(ShardInit, ParallelizeAllocatesTheShardsPlusOneFullParameter) {
  const auto config = config_of(4, 4, 256, 64, 256);
  const models::ParallelPlan plan(config);
  int64_t full_bytes = 0, largest = 0;
  for (const auto& p : plan.parameters()) {
    int64_t numel = 1;
    for (int64_t s : p.shape) numel *= s;
    full_bytes += 4 * numel;
    largest = std::max(largest, 4 * numel);
  }
  parallel::ParallelConfig layout;
  layout.tp = 2;
  const parallel::ParallelDims dims = models::gpt_dims(config, layout, 1, 2);
  install_memory_counter();
  std::mutex m;
  int64_t shard_bytes = 0;
  std::unique_ptr<MemoryWatermark> building;
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    parallel::Mesh mesh(world, dims.shape);
    world.barrier()->wait();
    if (world.rank() == 0) building = std::make_unique<MemoryWatermark>();
    world.barrier()->wait();
    auto model = models::parallelize(config, 5, dims, mesh, 2);
    world.barrier()->wait();
    std::lock_guard<std::mutex> lock(m);
    shard_bytes = std::max(shard_bytes, bytes_of(model->parameters()));
    EXPECT_EQ(model->global_shapes().size(), plan.parameters().size());
    for (const auto& p : plan.parameters()) EXPECT_EQ(model->global_shapes().at(p.name), p.shape) << p.name;
  });
  EXPECT_LT(shard_bytes, full_bytes * 6 / 10);
  // Each rank: its shards, one full parameter and its cut shard (a copy for the fused c_attn), the causal mask.
  const int64_t allowed = 2 * (shard_bytes + 2 * largest + config.block_size * config.block_size);
  EXPECT_LE(building->peak_above_baseline(), allowed)
      << "2 tensor-parallel ranks allocated " << building->peak_above_baseline() << " bytes building the model, whose "
      << "full size is " << full_bytes;
}

namespace {

// Peak bytes both ranks allocate (above what they held before) in a 3-step run at dp=2 with ZeRO stage `zero`. The
// batch is small, so model state dominates as it does at scale.
int64_t peak_bytes_of_run(int zero) {
  auto c = crosstrain::testing::tiny_config("shard_init_zero" + std::to_string(zero));
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_embd = 128;
  c.train.steps = 3;
  c.train.global_batch = 2;
  c.parallel.dp = 2;
  c.parallel.zero = zero;
  install_memory_counter();
  MemoryWatermark run;
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    train::Trainer trainer(c, world);
    train::TrainOptions o;
    o.quiet = true;
    trainer.run(o);
  });
  // The trainer restarts the counter's peak at each step (its activation watermark): this is the peak of the
  // last step and what followed it, above what the process held before the run, for both ranks.
  return run.peak_above_baseline();
}

}  // namespace

TEST(ZeroMemory, ShardingTheStateLowersThePeak) {
  std::vector<int64_t> peak;
  for (int zero = 0; zero <= 3; ++zero) peak.push_back(peak_bytes_of_run(zero));
  std::printf("peak bytes allocated above the baseline by both ranks, ZeRO-0..3: %lld %lld %lld %lld\n",
              static_cast<long long>(peak[0]), static_cast<long long>(peak[1]), static_cast<long long>(peak[2]),
              static_cast<long long>(peak[3]));
  EXPECT_LT(peak[1], peak[0]) << "ZeRO-1 should hold less than plain data parallel";
  EXPECT_LT(peak[3], peak[0]) << "ZeRO-3 should hold less than plain data parallel";
}
