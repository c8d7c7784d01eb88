// The Llama family's pieces against their definitions: rotary embeddings in the rotate-half layout (what
// transformers' LlamaForCausalLM computes), RMSNorm, grouped-query attention as shared key/value heads, and the
// parameter count the planner and MFU use. Layout parity is in test_layouts.cpp (LlamaLayouts).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "crosstrain/models/llama.h"
#include "crosstrain/models/parallel_plan.h"

using namespace crosstrain;

namespace {

models::GPTConfig llama_config(int64_t kv_heads) {
  models::GPTConfig c;
  c.arch = models::ModelArch::Llama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = kv_heads;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 64;
  return c;
}

TEST(Llama, RotaryRotatesEachPairOfHalvesByPositionTimesFrequency) {
  const int64_t T = 5, hd = 8;
  const double theta = 10000.0;
  auto x = torch::randn({1, 1, T, hd}, torch::TensorOptions().dtype(torch::kDouble));
  auto rope = models::rotary_tables(T, hd, theta);
  rope.cos = rope.cos.to(torch::kDouble), rope.sin = rope.sin.to(torch::kDouble);
  auto y = models::apply_rotary(x, rope);
  for (int64_t p = 0; p < T; ++p)
    for (int64_t j = 0; j < hd / 2; ++j) {
      const double angle = static_cast<double>(p) * std::pow(theta, -2.0 * static_cast<double>(j) / hd);
      const double a = x[0][0][p][j].item<double>(), b = x[0][0][p][j + hd / 2].item<double>();
      EXPECT_NEAR(y[0][0][p][j].item<double>(), a * std::cos(angle) - b * std::sin(angle), 1e-6) << p << "," << j;
      EXPECT_NEAR(y[0][0][p][j + hd / 2].item<double>(), b * std::cos(angle) + a * std::sin(angle), 1e-6);
    }
}

TEST(Llama, RotaryScoresDependOnlyOnRelativePosition) {
  const int64_t hd = 16;
  auto rope = models::rotary_tables(32, hd, 10000.0);
  auto q = torch::randn({hd}), k = torch::randn({hd});
  // The same q and k placed at every position: q_i . k_j must depend on i - j only.
  auto at_all = [&](const torch::Tensor& v) { return models::apply_rotary(v.expand({1, 1, 32, hd}).contiguous(), rope); };
  auto scores = torch::matmul(at_all(q)[0][0], at_all(k)[0][0].t());  // [32, 32]
  EXPECT_NEAR(scores[7][3].item<double>(), scores[20][16].item<double>(), 1e-4);
  EXPECT_NEAR(scores[3][7].item<double>(), scores[16][20].item<double>(), 1e-4);
  EXPECT_GT(std::abs(scores[7][3].item<double>() - scores[7][4].item<double>()), 1e-4) << "positions must matter";
}

TEST(Llama, RMSNormDividesByTheRootMeanSquare) {
  models::RMSNorm norm(4, 1e-5);
  {
    torch::NoGradGuard g;
    norm->weight.copy_(torch::tensor({1.0f, 2.0f, 0.5f, 1.0f}));
  }
  auto x = torch::tensor({{3.0f, -4.0f, 0.0f, 0.0f}});
  const double rms = std::sqrt((9.0 + 16.0) / 4.0 + 1e-5);
  auto y = norm(x);
  EXPECT_NEAR(y[0][0].item<double>(), 3.0 / rms, 1e-6);
  EXPECT_NEAR(y[0][1].item<double>(), -8.0 / rms, 1e-6);
  EXPECT_NEAR(y[0][3].item<double>(), 0.0, 1e-6);
}

// Grouped-query attention is multi-head attention whose key/value heads are shared: a model with 2 key/value
// heads equals the 4-head model whose k and v weights repeat each of those heads for its 2 query heads.
TEST(Llama, GroupedQueryAttentionSharesEachKeyValueHeadWithConsecutiveQueryHeads) {
  torch::manual_seed(0);
  models::GPT grouped(llama_config(2), 7), full(llama_config(4), 7);
  const int64_t hd = 8;
  {
    torch::NoGradGuard g;
    auto target = full->named_parameters();
    for (const auto& item : grouped->named_parameters()) {
      torch::Tensor v = item.value();
      const bool kv = item.key().find("k_proj") != std::string::npos || item.key().find("v_proj") != std::string::npos;
      if (kv) v = v.view({2, hd, -1}).repeat_interleave(2, 0).reshape({4 * hd, -1});
      target[item.key()].copy_(v);
    }
  }
  auto tokens = torch::randint(64, {2, 16});
  auto a = grouped(tokens), b = full(tokens);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-5);
  EXPECT_EQ(grouped->named_parameters()["h.0.attn.k_proj.weight"].size(0), 2 * hd);
}

TEST(Llama, ParameterCountIsTheModelsAndTheTiedHeadHasNoMatrixOfItsOwn) {
  for (bool tied : {false, true}) {
    auto c = llama_config(2);
    c.tie_embeddings = tied;
    models::GPT model(c, 1);
    int64_t n = 0;
    for (const auto& p : model->parameters()) n += p.numel();
    EXPECT_EQ(c.parameter_count(), n) << "tied " << tied;
    EXPECT_EQ(model->named_parameters().contains("lm_head.weight"), !tied);
    EXPECT_EQ(models::ParallelPlan(c).parameters().size(), model->named_parameters().size());
  }
  auto c = llama_config(2);
  EXPECT_EQ(c.mlp_hidden(), 96);  // 8 * 32 / 3 = 85, rounded up to a multiple of 32
  c.ffn_hidden = 40;
  EXPECT_EQ(c.mlp_hidden(), 40);
}

TEST(Llama, PlanSplitsKeyValueHeadsWithTheirQueryHeads) {
  const models::ParallelPlan plan(llama_config(2));
  const auto& k = plan.at("h.1.attn.k_proj.weight");
  EXPECT_EQ(k.split, models::Split::Column);
  EXPECT_EQ(k.shape, (std::vector<int64_t>{16, 32}));
  // tp rank 1 of 2 holds query heads 2, 3 and the key/value head 1 they use.
  EXPECT_EQ(models::shard_slice(plan.at("h.1.attn.q_proj.weight"), 1, 2).ranges[0].start, 16);
  EXPECT_EQ(models::shard_slice(k, 1, 2).ranges[0].start, 8);
  EXPECT_EQ(plan.at("h.1.attn.o_proj.weight").split, models::Split::Row);
  EXPECT_EQ(plan.at("h.1.mlp.down_proj.weight").split, models::Split::Row);
  EXPECT_EQ(plan.at("h.1.mlp_norm.weight").split, models::Split::Replicated);
  EXPECT_FALSE(plan.contains("wpe.weight"));
}

}  // namespace
