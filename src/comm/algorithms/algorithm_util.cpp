// The helpers that more than one algorithm file uses (declared, with what each does, in algorithm_util.h).
#include "algorithm_util.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo::detail {

// --- reductions of buffers -----------------------------------------------------------------------------------

void combine(at::Tensor& acc, const at::Tensor& x, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: acc.add_(x); break;
    case ReduceOp::Product: acc.mul_(x); break;
    case ReduceOp::Min: at::minimum_out(acc, acc, x); break;
    case ReduceOp::Max: at::maximum_out(acc, acc, x); break;
  }
}

void combine_out(at::Tensor& out, const at::Tensor& a, const at::Tensor& b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: at::add_out(out, a, b); break;
    case ReduceOp::Product: at::mul_out(out, a, b); break;
    case ReduceOp::Min: at::minimum_out(out, a, b); break;
    case ReduceOp::Max: at::maximum_out(out, a, b); break;
  }
}

void finish_avg(at::Tensor& t, ReduceOp op, int n) {
  if (op != ReduceOp::Avg || t.numel() == 0) return;
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) t.div_(n);
  else t.copy_(at::div(t, n, "trunc"));
}

// --- cutting buffers -------------------------------------------------------------------------------------------

std::pair<int64_t, int64_t> segment(int64_t numel, int parts, int i) {
  const int64_t base = numel / parts, extra = numel % parts;
  const int64_t begin = i * base + std::min<int64_t>(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

int ceil_pow2(int n) {
  int top = 1;
  while (top < n) top <<= 1;
  return top;
}

// --- checks of a call's buffers --------------------------------------------------------------------------------

void check_flat(const char* what, const at::Tensor& t) {
  if (!t.defined() || !t.is_contiguous()) throw UsageError(std::string(what) + ": buffers must be contiguous tensors");
}

void check_sliced(const char* what, const at::Tensor& one, const at::Tensor& many, int n) {
  check_flat(what, one);
  check_flat(what, many);
  if (many.numel() != one.numel() * n)
    throw UsageError(std::string(what) + ": the sliced buffer must hold size() (" + std::to_string(n) + ") x " +
                     std::to_string(one.numel()) + " elements, not " + std::to_string(many.numel()));
  if (one.scalar_type() != many.scalar_type())
    throw UsageError(std::string(what) + ": input and output must have the same dtype");
}

// --- binomial scatter ----------------------------------------------------------------------------------------

void binomial_scatter(Links& l, const Pieces& piece, int m, int v, const RankOf& rank, int tag) {
  std::vector<WorkPtr> sends;
  for (int k = ceil_pow2(m) / 2; k > 0; k >>= 1) {
    if ((v & (2 * k - 1)) == 0) {
      if (v + k < m) sends.push_back(l.post_send(piece(v + k, std::min(v + 2 * k, m)), rank(v + k), tag));
    } else if ((v & (2 * k - 1)) == k) {
      l.recv(piece(v, std::min(v + k, m)), rank(v - k), tag);
    }
  }
  l.wait_all(sends);
}

// --- one-shot wrappers -----------------------------------------------------------------------------------------

AlgorithmOptions with_tag(int tag) {
  AlgorithmOptions o;
  o.tag = tag;
  return o;
}

}  // namespace crosstrain::comm::algo::detail
