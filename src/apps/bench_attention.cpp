#include "bench_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "crosstrain/core/threads.h"
#include "crosstrain/models/fused_attention.h"

namespace crosstrain::apps {
namespace {

using Attention = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&);

at::Tensor reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  return models::reference_causal_attention(q, k, v);
}

// One training step's attention as GPT runs it: heads cut from a [B, T, 3C] projection (views), forward, and
// backward down to the projection's gradient. Returns seconds.
double time_pass(Attention attention, const at::Tensor& qkv, const at::Tensor& dout, int64_t heads) {
  const auto B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / heads;
  auto leaf = qkv.detach().requires_grad_(true);
  const auto start = std::chrono::steady_clock::now();
  auto parts = leaf.split(C, 2);
  auto cut = [&](const at::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
  attention(cut(parts[0]), cut(parts[1]), cut(parts[2])).backward(dout);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

// Largest |fused - reference| over the output: the timed kernels also agree.
double max_difference(const at::Tensor& qkv, int64_t heads) {
  const auto B = qkv.size(0), T = qkv.size(1), C = qkv.size(2) / 3, hd = C / heads;
  auto parts = qkv.split(C, 2);
  auto cut = [&](const at::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
  auto fused = models::causal_attention(cut(parts[0]), cut(parts[1]), cut(parts[2]));
  auto dense = reference(cut(parts[0]), cut(parts[1]), cut(parts[2]));
  return (fused - dense).abs().max().item<double>();
}

}  // namespace

int bench_attention(const BenchAttentionOptions& o) {
  limit_compute_threads(o.threads);
  std::printf("# causal attention forward+backward, B=%lld H=%lld hd=%lld, %d thread(s), median of %d "
              "(alternating order)\n",
              static_cast<long long>(o.batch), static_cast<long long>(o.heads), static_cast<long long>(o.head_dim),
              o.threads, o.repeat);
  std::printf("%6s %14s %10s %8s %14s\n", "T", "reference_ms", "fused_ms", "speedup", "max_abs_diff");
  std::vector<std::string> lines;
  for (const int64_t T : o.lengths) {
    at::manual_seed(0);
    auto qkv = at::randn({o.batch, T, 3 * o.heads * o.head_dim});
    auto dout = at::randn({o.batch, o.heads, T, o.head_dim});
    std::vector<double> dense, fused;
    time_pass(reference, qkv, dout, o.heads);  // warm-up: first-touch of the buffers, BLAS start-up
    time_pass(models::causal_attention, qkv, dout, o.heads);
    for (int r = 0; r < o.repeat; ++r) {
      // Alternating which path runs first, so neither always follows the other's cache state.
      if (r % 2 == 0) dense.push_back(time_pass(reference, qkv, dout, o.heads));
      fused.push_back(time_pass(models::causal_attention, qkv, dout, o.heads));
      if (r % 2 == 1) dense.push_back(time_pass(reference, qkv, dout, o.heads));
    }
    const double d = median(dense) * 1e3, f = median(fused) * 1e3;
    std::printf("%6lld %14.2f %10.2f %8.2f %14.2e\n", static_cast<long long>(T), d, f, d / f,
                max_difference(qkv, o.heads));
    char line[160];
    std::snprintf(line, sizeof line, "T=%lld reference_ms=%.2f fused_ms=%.2f speedup=%.2f",
                  static_cast<long long>(T), d, f, d / f);
    lines.emplace_back(line);
    std::fflush(stdout);
  }
  for (const auto& line : lines) std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace crosstrain::apps
