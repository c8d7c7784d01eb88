#include "peak_flops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs `product` until `seconds` have passed (and at least twice); returns products per second.
template <typename F>
double products_per_second(F&& product, double seconds) {
  int64_t count = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds || count < 2) {
    product();
    ++count;
    elapsed = seconds_since(start);
  }
  return static_cast<double>(count) / elapsed;
}

// FLOP/s of one shape: random operands (zeros could take fast paths), a warm-up that pays for first-call costs
// (the kernel's choice, packing buffers, page faults of the output), then the better of two timed runs, each long
// enough to be sustained: a run that another process's burst on the same core slowed down does not set the peak.
double measure_shape(const GemmShape& s, at::ScalarType dtype, double seconds) {
  const auto options = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::randn({s.m, s.k}, options);
  const at::Tensor weight = at::randn({s.n, s.k}, options);  // at::linear's layout: outputs x inputs
  const at::Tensor bias = s.bias ? at::randn({s.n}, options) : at::Tensor();
  const auto product = [&] { (void)at::linear(x, weight, bias); };
  products_per_second(product, seconds / 2);
  const double first = products_per_second(product, seconds);
  return s.flops() * std::max(first, products_per_second(product, seconds));
}

}  // namespace

std::string GemmShape::describe() const {
  return name + " " + std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
}

std::vector<GemmShape> gpt_gemm_shapes(const models::GPTConfig& model, int64_t tokens_per_micro_batch) {
  if (tokens_per_micro_batch < 1)
    throw UsageError("MFU peak: " + std::to_string(tokens_per_micro_batch) +
                     " tokens per micro-batch; train.global_batch must leave each micro-batch a sequence");
  const int64_t t = tokens_per_micro_batch, d = model.n_embd;
  return {{"qkv", t, d, 3 * d, true},
          {"proj", t, d, d, true},
          {"mlp_up", t, d, 4 * d, true},
          {"mlp_down", t, 4 * d, d, true},
          {"head", t, d, model.vocab_size, false}};
}

GemmPeak measure_gemm_peak(const models::GPTConfig& model, int64_t tokens_per_micro_batch, at::ScalarType dtype,
                           double seconds_per_shape) {
  at::NoGradGuard no_grad;
  GemmPeak peak;
  for (const GemmShape& s : gpt_gemm_shapes(model, tokens_per_micro_batch)) {
    const double flops = measure_shape(s, dtype, seconds_per_shape);
    peak.by_shape.emplace_back(s.describe(), flops);
    if (flops > peak.best_flops) {
      peak.best_flops = flops;
      peak.best_shape = s.describe();
    }
  }
  return peak;
}

std::string describe(const GemmPeak& peak) {
  char head[160];
  std::snprintf(head, sizeof head, "best %.2f GFLOP/s (%s)", peak.best_flops / 1e9, peak.best_shape.c_str());
  std::string text = head;
  for (size_t i = 0; i < peak.by_shape.size(); ++i) {
    char part[160];
    std::snprintf(part, sizeof part, "%s%s %.2f", i == 0 ? "; " : ", ", peak.by_shape[i].first.c_str(),
                  peak.by_shape[i].second / 1e9);
    text += part;
  }
  return text + " GFLOP/s";
}

}  // namespace crosstrain::train
