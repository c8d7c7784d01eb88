// The GPT's parallel plan as a table (pure): one entry per parameter, shards that tile the full tensor, units
// and stages that partition the model.
#include <gtest/gtest.h>

#include <set>

#include "crosstrain/core/error.h"
#include "crosstrain/models/parallel_plan.h"

using namespace crosstrain;
using models::ParallelPlan;
using models::Split;
using models::StageSpec;

namespace {

models::GPTConfig small() {
  models::GPTConfig c;
  c.n_layer = 3;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 64;
  return c;
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

}  // namespace

TEST(ParallelPlan, OneEntryPerParameterWithTheModelsCount) {
  const auto c = small();
  ParallelPlan plan(c);
  std::set<std::string> names;
  int64_t total = 0;
  for (const auto& p : plan.parameters()) {
    EXPECT_TRUE(names.insert(p.name).second) << p.name;
    EXPECT_EQ(&plan.at(p.name), &p);
    total += numel(p.shape);
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(12 * c.n_layer + 5));
  EXPECT_EQ(total, c.parameter_count());
  EXPECT_THROW(plan.at("h.3.attn.c_attn.weight"), Error);  // only 3 blocks
  EXPECT_FALSE(plan.contains("h.0.attn.mask"));
}

TEST(ParallelPlan, SplitKinds) {
  ParallelPlan plan(small());
  EXPECT_EQ(plan.at("wte.weight").split, Split::Vocabulary);
  EXPECT_EQ(plan.at("wpe.weight").split, Split::Replicated);
  EXPECT_EQ(plan.at("h.1.attn.c_attn.weight").split, Split::Column);
  EXPECT_EQ(plan.at("h.1.attn.c_attn.weight").fused, 3);
  EXPECT_EQ(plan.at("h.1.attn.c_proj.weight").split, Split::Row);
  EXPECT_EQ(plan.at("h.1.attn.c_proj.bias").split, Split::Replicated);  // added once, after the reduction
  EXPECT_EQ(plan.at("h.1.mlp.c_fc.bias").split, Split::Column);
  EXPECT_EQ(plan.at("h.1.mlp.c_proj.weight").split, Split::Row);
  EXPECT_EQ(plan.at("h.1.ln_2.weight").split, Split::Replicated);
  EXPECT_EQ(plan.at("lm_head.weight").split, Split::Column);
  for (const auto& p : plan.parameters()) EXPECT_EQ(p.partial_under_sp, p.split == Split::Replicated) << p.name;
}

TEST(ParallelPlan, ShardsTileTheFullTensorForEveryTp) {
  ParallelPlan plan(small());
  for (int tp : {1, 2, 4}) {
    for (const auto& p : plan.parameters()) {
      const auto shape = models::shard_shape(p, tp);
      ASSERT_EQ(shape.size(), p.shape.size()) << p.name;
      const bool split = tp > 1 && p.split != Split::Replicated;
      EXPECT_EQ(numel(shape) * (split ? tp : 1), numel(p.shape)) << p.name << " tp " << tp;
      if (!split) {
        EXPECT_EQ(models::shard_slice(p, tp - 1, tp).dim, -1) << p.name;
        continue;
      }
      // Every index of the split dimension is held by exactly one rank.
      const auto first = models::shard_slice(p, 0, tp);
      std::vector<int> held(static_cast<size_t>(p.shape[first.dim]), 0);
      for (int r = 0; r < tp; ++r) {
        const auto s = models::shard_slice(p, r, tp);
        EXPECT_EQ(s.dim, first.dim);
        int64_t length = 0;
        for (const auto& range : s.ranges) {
          length += range.length;
          for (int64_t i = range.start; i < range.start + range.length; ++i) ++held.at(static_cast<size_t>(i));
        }
        EXPECT_EQ(length, shape[s.dim]) << p.name;
      }
      for (int h : held) EXPECT_EQ(h, 1) << p.name << " tp " << tp;
    }
  }
}

TEST(ParallelPlan, FusedQkvSplitsEachOfQKAndVByHeads) {
  ParallelPlan plan(small());  // n_embd 32: q rows [0, 32), k [32, 64), v [64, 96)
  const auto s = models::shard_slice(plan.at("h.0.attn.c_attn.weight"), 1, 2);
  EXPECT_EQ(s.dim, 0);
  ASSERT_EQ(s.ranges.size(), 3u);
  EXPECT_EQ(s.ranges[0].start, 16);
  EXPECT_EQ(s.ranges[1].start, 48);
  EXPECT_EQ(s.ranges[2].start, 80);
  EXPECT_EQ(s.ranges[2].length, 16);
  EXPECT_EQ(models::shard_slice(plan.at("h.0.mlp.c_proj.weight"), 1, 2).dim, 1);  // row-parallel: input dim
  EXPECT_THROW(models::shard_slice(plan.at("wte.weight"), 0, 3), UsageError);     // 64 rows over 3
}

TEST(ParallelPlan, UnitsAndStagesPartitionTheModel) {
  const auto c = small();
  ParallelPlan plan(c);
  const auto bounds = models::partition_gpt(c, 3);
  std::multiset<std::string> seen;
  for (int s = 0; s < 3; ++s) {
    StageSpec spec{bounds[s], bounds[s + 1], s == 0, s == 2};
    const auto units = plan.units(spec);
    const size_t blocks = static_cast<size_t>(spec.last_layer - spec.first_layer);
    EXPECT_EQ(units.size(), blocks + (spec.has_embedding ? 1 : 0) + (spec.has_head ? 1 : 0));
    std::vector<std::string> flat;
    for (const auto& u : units) flat.insert(flat.end(), u.begin(), u.end());
    EXPECT_EQ(flat, plan.stage_parameters(spec));  // units in forward order cover the stage
    seen.insert(flat.begin(), flat.end());
  }
  EXPECT_EQ(seen.size(), plan.parameters().size());
  for (const auto& p : plan.parameters()) EXPECT_EQ(seen.count(p.name), 1u) << p.name;

  const auto whole = plan.units({0, c.n_layer, true, true});
  EXPECT_EQ(whole.front(), (std::vector<std::string>{"wte.weight", "wpe.weight"}));
  EXPECT_EQ(whole[2].front(), "h.1.ln_1.weight");
  EXPECT_EQ(whole[2].size(), 12u);
  EXPECT_EQ(whole.back(), (std::vector<std::string>{"ln_f.weight", "ln_f.bias", "lm_head.weight"}));
}

TEST(ParallelPlan, ReplicationAndPartialGradients) {
  ParallelPlan plan(small());
  StageSpec middle{1, 2, false, false};
  EXPECT_FALSE(plan.is_replicated("h.1.ln_1.weight", 1));  // no group: nothing to count once
  EXPECT_TRUE(plan.is_replicated("h.1.ln_1.weight", 2));
  EXPECT_FALSE(plan.is_replicated("h.1.mlp.c_fc.weight", 2));
  EXPECT_TRUE(plan.partial_gradient_parameters(middle, 2, false).empty());
  EXPECT_TRUE(plan.partial_gradient_parameters(middle, 1, true).empty());
  EXPECT_EQ(plan.partial_gradient_parameters(middle, 2, true),
            (std::vector<std::string>{"h.1.ln_1.weight", "h.1.ln_1.bias", "h.1.attn.c_proj.bias", "h.1.ln_2.weight",
                                      "h.1.ln_2.bias", "h.1.mlp.c_proj.bias"}));
  const auto first = plan.partial_gradient_parameters({0, 1, true, false}, 2, true);
  EXPECT_EQ(first.front(), "wpe.weight");  // each rank adds its slice of the positions
}
