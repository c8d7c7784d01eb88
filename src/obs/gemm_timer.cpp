#include "crosstrain/obs/gemm_timer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

namespace crosstrain::obs {
namespace {

using Clock = std::chrono::steady_clock;

// Runs `product` until `seconds` have passed (and at least twice); returns products per second.
template <typename F>
double products_per_second(F&& product, double seconds) {
  int64_t count = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  while (elapsed < seconds || count < 2) {
    product();
    ++count;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  }
  return static_cast<double>(count) / elapsed;
}

}  // namespace

std::string GemmShape::describe() const {
  const std::string dims = std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n);
  return name.empty() ? dims : name + " " + dims;
}

double time_gemm(const GemmShape& s, at::ScalarType dtype, double seconds) {
  at::NoGradGuard no_grad;
  const auto options = at::TensorOptions().dtype(dtype);
  const at::Tensor x = at::randn({s.m, s.k}, options);
  const at::Tensor weight_t = at::randn({s.n, s.k}, options).t();  // at::linear's layout (outputs x inputs), used as x W^T
  const at::Tensor bias = s.bias ? at::randn({s.n}, options) : at::Tensor();
  at::Tensor out = at::empty({s.m, s.n}, options);
  const auto product = [&] {
    if (s.bias) at::addmm_out(out, bias, x, weight_t);
    else at::mm_out(out, x, weight_t);
  };
  products_per_second(product, seconds / 2);
  const double first = products_per_second(product, seconds);
  return s.flops() * std::max(first, products_per_second(product, seconds));
}

}  // namespace crosstrain::obs
