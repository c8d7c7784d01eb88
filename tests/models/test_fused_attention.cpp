// Fused causal attention (models/fused_attention.h) against the dense reference (matmul, masked_fill -inf,
// softmax, matmul, differentiated by autograd): forward and the three input gradients at many shapes, bf16,
// causality, no T x T buffer, and GPT's logits and loss with either path.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <limits>
#include <tuple>
#include <vector>

#include "crosstrain/models/fused_attention.h"
#include "crosstrain/models/gpt.h"

namespace crosstrain::models {
namespace {

struct Result {
  at::Tensor out, dq, dk, dv;
};

// Forward and backward of `attention` with a fixed output gradient, on heads cut from one [B, T, 3 H hd]
// projection as GPT cuts them (non-contiguous views), or on contiguous [B, H, T, hd] tensors.
template <typename Attention>
Result run(Attention attention, const at::Tensor& qkv, const at::Tensor& dout, int64_t H, bool views) {
  const auto B = qkv.size(0), T = qkv.size(1), hd = qkv.size(2) / (3 * H);
  auto leaf = qkv.detach().clone().requires_grad_(true);
  auto parts = leaf.split(H * hd, 2);
  auto heads = [&](const at::Tensor& t) {
    auto h = t.view({B, T, H, hd}).transpose(1, 2);
    return views ? h : h.contiguous();
  };
  auto out = attention(heads(parts[0]), heads(parts[1]), heads(parts[2]));
  out.backward(dout);
  auto grad = leaf.grad().split(H * hd, 2);
  return {out.detach(), heads(grad[0]).contiguous(), heads(grad[1]).contiguous(), heads(grad[2]).contiguous()};
}

at::Tensor fused(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) { return causal_attention(q, k, v); }
at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return reference_causal_attention(q, k, v);
}

// |a - b| <= atol + rtol |b| everywhere, with the worst element in the message.
void expect_close(const at::Tensor& a, const at::Tensor& b, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(a.sizes(), b.sizes()) << what;
  auto a64 = a.to(at::kDouble), b64 = b.to(at::kDouble);
  auto excess = (a64 - b64).abs() - (atol + rtol * b64.abs());
  EXPECT_LE(excess.max().item<double>(), 0.0)
      << what << ": max |diff| " << (a64 - b64).abs().max().item<double>() << " (atol " << atol << ", rtol " << rtol
      << ")";
}

// fp32: output and gradients within 1e-5 absolute + 1e-5 relative of the reference, at the T that cross tile
// edges (1, 2, 7, 64, 65, 127, 200, 300), several head dims, heads and batch sizes, views and contiguous inputs.
TEST(FusedAttention, MatchesReferenceForwardAndGradients) {
  at::manual_seed(0);
  const std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{{1, 1, 16}, {2, 3, 32}, {1, 2, 64}};  // B, H, hd
  for (int64_t T : {1, 2, 7, 64, 65, 127, 200, 300})
    for (const auto& [B, H, hd] : shapes) {
      auto qkv = at::randn({B, T, 3 * H * hd}), dout = at::randn({B, H, T, hd});
      const bool views = (T + hd) % 2 == 0;
      const Result f = run(fused, qkv, dout, H, views), r = run(reference, qkv, dout, H, views);
      const std::string at = "T=" + std::to_string(T) + " B=" + std::to_string(B) + " H=" + std::to_string(H) +
                             " hd=" + std::to_string(hd);
      expect_close(f.out, r.out, 1e-5, 1e-5, "output " + at);
      expect_close(f.dq, r.dq, 1e-5, 1e-5, "dq " + at);
      expect_close(f.dk, r.dk, 1e-5, 1e-5, "dk " + at);
      expect_close(f.dv, r.dv, 1e-5, 1e-5, "dv " + at);
    }
}

// Large scores (softmax close to one-hot, where the online rescaling matters most; scores of +-50 carry fp32
// rounding of ~1e-5 in either path, and v here is ~16): the fused result is within 3x the dense fp32 path's own
// distance to a float64 reference.
TEST(FusedAttention, AsAccurateAsReferenceWithPeakedScores) {
  at::manual_seed(1);
  const int64_t B = 1, H = 2, T = 150, hd = 32;
  auto qkv = at::randn({B, T, 3 * H * hd}) * 4, dout = at::randn({B, H, T, hd});
  const Result f = run(fused, qkv, dout, H, true), r = run(reference, qkv, dout, H, true);
  const Result exact = run(reference, qkv.to(at::kDouble), dout.to(at::kDouble), H, true);
  auto error = [](const at::Tensor& a, const at::Tensor& b) { return (a.to(at::kDouble) - b).abs().max().item<double>(); };
  const std::vector<std::tuple<std::string, at::Tensor, at::Tensor, at::Tensor>> outputs{
      {"output", f.out, r.out, exact.out}, {"dq", f.dq, r.dq, exact.dq}, {"dk", f.dk, r.dk, exact.dk},
      {"dv", f.dv, r.dv, exact.dv}};
  for (const auto& [name, fused_value, dense_value, exact_value] : outputs)
    EXPECT_LE(error(fused_value, exact_value), 3 * error(dense_value, exact_value) + 1e-6) << name;
}

// bf16 in, bf16 out (and bf16 gradients), within bf16's rounding of the fp32 reference on the same inputs.
TEST(FusedAttention, Bf16WithinBf16Tolerance) {
  at::manual_seed(2);
  const int64_t B = 2, H = 2, T = 130, hd = 32;
  auto qkv = at::randn({B, T, 3 * H * hd}).to(at::kBFloat16), dout = at::randn({B, H, T, hd}).to(at::kBFloat16);
  const Result f = run(fused, qkv, dout, H, true);
  const Result r = run(reference, qkv.to(at::kFloat), dout.to(at::kFloat), H, true);
  for (const auto& t : {f.out, f.dq, f.dk, f.dv}) EXPECT_EQ(t.scalar_type(), at::kBFloat16);
  expect_close(f.out, r.out, 2e-2, 2e-2, "bf16 output");
  expect_close(f.dq, r.dq, 3e-2, 3e-2, "bf16 dq");
  expect_close(f.dk, r.dk, 3e-2, 3e-2, "bf16 dk");
  expect_close(f.dv, r.dv, 3e-2, 3e-2, "bf16 dv");
}

// A later token changed (its query, key and value) leaves every earlier output bit for bit, and changes its own:
// a mask off by one on the diagonal tile, or a tile above the diagonal read, turns this red. The gradients of a
// loss on the earlier outputs reach no later key or value.
TEST(FusedAttention, FutureTokensDoNotLeak) {
  at::manual_seed(3);
  const int64_t B = 1, H = 2, T = 150, hd = 16;
  for (int64_t t : {0, 1, 63, 64, 65, 100, 149}) {
    auto q = at::randn({B, H, T, hd}), k = at::randn({B, H, T, hd}), v = at::randn({B, H, T, hd});
    auto q2 = q.clone(), k2 = k.clone(), v2 = v.clone();
    for (auto* x : {&q2, &k2, &v2}) x->select(2, t).add_(1.0);
    auto a = causal_attention(q, k, v), b = causal_attention(q2, k2, v2);
    EXPECT_TRUE(at::equal(a.slice(2, 0, t), b.slice(2, 0, t))) << "an output before token " << t << " changed";
    EXPECT_FALSE(at::allclose(a.select(2, t), b.select(2, t))) << "token " << t << "'s output did not change";

    auto kg = k.clone().requires_grad_(true), vg = v.clone().requires_grad_(true);
    causal_attention(q, kg, vg).slice(2, 0, t + 1).sum().backward();
    EXPECT_TRUE(kg.grad().slice(2, t + 1).eq(0).all().item<bool>()) << "dk past token " << t;
    EXPECT_TRUE(vg.grad().slice(2, t + 1).eq(0).all().item<bool>()) << "dv past token " << t;
    EXPECT_GT(vg.grad().select(2, t).abs().sum().item<double>(), 0.0);
  }
}

TEST(FusedAttention, OneTokenAttendsToItself) {
  auto q = at::randn({2, 3, 1, 8}), k = at::randn({2, 3, 1, 8}), v = at::randn({2, 3, 1, 8});
  EXPECT_TRUE(at::allclose(causal_attention(q, k, v), v, 0, 1e-6));
}

// A NaN in a key reaches every output that sees it, as in the dense path (divergence checks look for it), and
// no output before it.
TEST(FusedAttention, NanPropagatesToTheOutputsThatSeeIt) {
  auto q = at::randn({1, 1, 100, 16}), k = at::randn({1, 1, 100, 16}), v = at::randn({1, 1, 100, 16});
  k[0][0][70][3] = std::numeric_limits<float>::quiet_NaN();
  auto out = causal_attention(q, k, v);
  EXPECT_FALSE(out.slice(2, 0, 70).isnan().any().item<bool>());
  EXPECT_TRUE(out.slice(2, 70).isnan().all().item<bool>());
}

TEST(FusedAttention, MismatchedShapesAreRejected) {
  auto q = at::randn({1, 2, 8, 16});
  EXPECT_THROW(causal_attention(q, at::randn({1, 2, 9, 16}), q), c10::Error);
  EXPECT_THROW(causal_attention(q.flatten(0, 1), q.flatten(0, 1), q.flatten(0, 1)), c10::Error);
}

// Records the largest single CPU allocation while installed (libtorch allocates every CPU tensor through it).
class LargestAllocation : public c10::Allocator {
 public:
  LargestAllocation() : inner_(c10::GetCPUAllocator()) { c10::SetCPUAllocator(this, /*priority=*/100); }
  ~LargestAllocation() override { c10::SetCPUAllocator(inner_, 100); }
  c10::DataPtr allocate(size_t n) const override {
    size_t seen = largest_.load();
    while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
    }
    return inner_->allocate(n);
  }
  c10::DeleterFnPtr raw_deleter() const override { return inner_->raw_deleter(); }
  size_t largest() const { return largest_.load(); }

 private:
  c10::Allocator* inner_;
  mutable std::atomic<size_t> largest_{0};
};

size_t largest_allocation(at::Tensor (*attention)(const at::Tensor&, const at::Tensor&, const at::Tensor&),
                          int64_t T) {
  auto q = at::randn({1, 1, T, 16}).requires_grad_(), k = at::randn({1, 1, T, 16}).requires_grad_(),
       v = at::randn({1, 1, T, 16}).requires_grad_();
  LargestAllocation probe;
  attention(q, k, v).sum().backward();
  return probe.largest();
}

// Forward and backward at T = 1024 allocate nothing near T x T floats (4 MiB); the dense path does (which shows
// the probe sees the allocations).
TEST(FusedAttention, NoScoreMatrixIsAllocated) {
  const int64_t T = 1024;
  const size_t scores = T * T * sizeof(float);
  EXPECT_GE(largest_allocation(reference, T), scores);
  EXPECT_LT(largest_allocation(fused, T), scores / 16);
}

GPTConfig small_gpt(double dropout) {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.block_size = 96;
  c.vocab_size = 50;
  c.dropout = dropout;
  return c;
}

// Sets the fused-attention switch for a scope (CROSSTRAIN_FUSED_ATTENTION=0 may have turned it off).
struct FusedSwitch {
  bool before = fused_attention_enabled();
  explicit FusedSwitch(bool on) { set_fused_attention(on); }
  ~FusedSwitch() { set_fused_attention(before); }
};

// GPT's logits, loss and parameter gradients with the fused attention equal the dense path's within 1e-5.
TEST(FusedAttention, GptMatchesReferencePath) {
  GPT model(small_gpt(0.0), 7);
  at::manual_seed(4);
  auto tokens = at::randint(0, 50, {3, 90}), targets = at::randint(0, 50, {3, 90});
  auto pass = [&] {
    model->zero_grad();
    auto logits = model->forward(tokens);
    auto loss = model->loss(tokens, targets);
    loss.backward();
    return std::make_tuple(logits.detach(), loss.detach(), model->h[0]->as<Block>()->attn->c_attn->weight.grad().clone());
  };
  FusedSwitch fused_on(true);
  auto [logits, loss, grad] = pass();
  FusedSwitch dense(false);
  auto [ref_logits, ref_loss, ref_grad] = pass();
  expect_close(logits, ref_logits, 1e-5, 1e-5, "logits");
  expect_close(loss, ref_loss, 1e-5, 1e-5, "loss");
  expect_close(grad, ref_grad, 1e-5, 1e-5, "h.0.attn.c_attn.weight gradient");
}

// With attention dropout in training GPT takes the dense path (the fused kernel has none): the same dropout
// draws give the same logits, fused switch on or off.
TEST(FusedAttention, GptTrainingWithDropoutUsesTheReference) {
  FusedSwitch fused_on(true);
  GPT model(small_gpt(0.2), 7);
  model->train();
  auto tokens = at::randint(0, 50, {2, 40});
  at::manual_seed(5);
  auto with_switch_on = model->forward(tokens).detach();
  at::Tensor dense;
  {
    FusedSwitch forced(false);
    at::manual_seed(5);
    dense = model->forward(tokens).detach();
  }
  EXPECT_TRUE(at::equal(with_switch_on, dense));
  model->eval();  // no dropout: the fused kernel again, still within 1e-5
  auto fused_eval = model->forward(tokens).detach();
  FusedSwitch forced(false);
  expect_close(fused_eval, model->forward(tokens).detach(), 1e-5, 1e-5, "eval logits");
}

}  // namespace
}  // namespace crosstrain::models
