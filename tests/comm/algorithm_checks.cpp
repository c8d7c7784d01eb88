#include "algorithm_checks.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "conformance.h"
#include "crosstrain/comm/reference.h"

namespace crosstrain::testing {

namespace algo = comm::algo;
using comm::ReduceOp;

std::string AlgorithmVariant::name() const {
  std::string s = algo::to_string(algorithm);
  if (algorithm == algo::Algorithm::Hierarchical) s += "(groups of " + std::to_string(group_size) + ")";
  if (piece_bytes >= 0) s += "(pieces of " + std::to_string(piece_bytes) + " bytes)";
  return s;
}

std::vector<AlgorithmVariant> algorithm_variants(algo::Algorithm a, int n) {
  if (a == algo::Algorithm::Ring) return {{a, 0}, {a, 0, 64}};
  if (a != algo::Algorithm::Hierarchical) return {{a, 0}};
  std::vector<AlgorithmVariant> out;
  for (int g = 1; g <= n; ++g)
    if (n % g == 0) out.push_back({a, g});
  return out;
}

namespace {

struct Report {
  const comm::Communicator& c;
  std::string who;
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(who + ": " + what + " wrong on rank " + std::to_string(c.rank()));
  }
};

std::string label(const std::string& op, at::ScalarType dtype, int64_t numel) {
  return op + " " + c10::toString(dtype) + " numel=" + std::to_string(numel);
}

}  // namespace

std::vector<std::string> check_algorithm(comm::Communicator& c, const AlgorithmVariant& v,
                                         const AlgorithmCheckOptions& o) {
  const int n = c.size(), me = c.rank();
  algo::AlgorithmOptions options;
  options.group_size = v.group_size;
  if (v.piece_bytes >= 0) options.piece_bytes = v.piece_bytes;
  auto obj = algo::make_algorithm(v.algorithm, c, options);
  Report report{c, v.name() + " on " + std::to_string(n) + " ranks", {}};

  const int64_t largest = *std::max_element(o.sizes.begin(), o.sizes.end());
  const int64_t large_per = o.large / n;  // per-rank slice of the large sliced buffers
  obj->reserve(std::max({largest * n, o.large, large_per * n}), at::kLong);  // the widest dtype below
  const int reserved = obj->allocations();

  int salt = 0;
  auto input = [&](int rank, at::ScalarType dtype, int64_t numel, bool product = false) {
    return conformance_input(rank, dtype, numel, salt, product);
  };
  auto each_size = [&](int64_t large, const auto& body) {
    for (at::ScalarType dtype : o.dtypes)
      for (int64_t numel : o.sizes) body(numel, dtype, false);
    if (large > 0) body(large, at::kFloat, true);
  };
  std::vector<int> roots{0, n / 2, n - 1};
  roots.erase(std::unique(roots.begin(), roots.end()), roots.end());

  // all-reduce: every reduction; the large buffer with sum and avg.
  each_size(o.large, [&](int64_t numel, at::ScalarType dtype, bool large) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
      if (large && op != ReduceOp::Sum && op != ReduceOp::Avg) continue;
      ++salt;
      const bool product = op == ReduceOp::Product;
      std::vector<at::Tensor> all;
      for (int q = 0; q < n; ++q) all.push_back(input(q, dtype, numel, product));
      at::Tensor t = all[me].clone();
      obj->all_reduce(t, op);
      report.expect(at::equal(t, comm::reduce_reference(all, op)),
                    label(std::string("allreduce(") + comm::to_string(op) + ")", dtype, numel));
    }
  });

  // reduce-scatter: `per` elements per rank.
  each_size(large_per, [&](int64_t per, at::ScalarType dtype, bool large) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Product}) {
      if (large && op != ReduceOp::Sum) continue;
      ++salt;
      const bool product = op == ReduceOp::Product;
      std::vector<at::Tensor> all;
      for (int q = 0; q < n; ++q) all.push_back(input(q, dtype, per * n, product));
      at::Tensor out = at::zeros({per}, at::TensorOptions().dtype(dtype));
      obj->reduce_scatter(all[me], out, op);
      at::Tensor want = comm::reduce_reference(all, op).slice(0, me * per, (me + 1) * per);
      report.expect(at::equal(out, want), label(std::string("reducescatter(") + comm::to_string(op) + ")", dtype, per));
    }
  });

  // all-gather
  each_size(large_per, [&](int64_t per, at::ScalarType dtype, bool) {
    ++salt;
    std::vector<at::Tensor> parts;
    for (int q = 0; q < n; ++q) parts.push_back(input(q, dtype, per));
    at::Tensor out = at::zeros({per * n}, at::TensorOptions().dtype(dtype));
    obj->all_gather(parts[me], out);
    report.expect(at::equal(out, at::cat(parts)), label("allgather", dtype, per));
  });

  // broadcast from the first, a middle and the last rank
  each_size(o.large, [&](int64_t numel, at::ScalarType dtype, bool) {
    for (int root : roots) {
      ++salt;
      at::Tensor want = input(root, dtype, numel);
      at::Tensor t = me == root ? want.clone() : at::zeros({numel}, at::TensorOptions().dtype(dtype));
      obj->broadcast(t, root);
      report.expect(at::equal(t, want), label("broadcast(root " + std::to_string(root) + ")", dtype, numel));
    }
  });

  // all-to-all (pairwise): slice j of rank q is input(q*n + j)
  for (int64_t per : o.sizes) {
    ++salt;
    std::vector<at::Tensor> mine, expect;
    for (int j = 0; j < n; ++j) mine.push_back(input(me * n + j, at::kFloat, per));
    for (int q = 0; q < n; ++q) expect.push_back(input(q * n + me, at::kFloat, per));
    at::Tensor out = at::zeros({per * n});
    obj->all_to_all(at::cat(mine), out);
    report.expect(at::equal(out, at::cat(expect)), label("alltoall", at::kFloat, per));
  }

  // The binomial tree's rooted operations.
  if (auto* tree = dynamic_cast<algo::TreeAlgorithm*>(obj.get())) {
    for (int64_t per : o.sizes) {
      for (int root : roots) {
        ++salt;
        std::vector<at::Tensor> all;
        for (int q = 0; q < n; ++q) all.push_back(input(q, at::kLong, per * n));
        at::Tensor t = all[me].clone();
        tree->reduce(t, root, ReduceOp::Avg);
        if (me == root)
          report.expect(at::equal(t, comm::reduce_reference(all, ReduceOp::Avg)), label("tree reduce(avg)", at::kLong, per * n));
        std::vector<at::Tensor> parts;
        for (int q = 0; q < n; ++q) parts.push_back(input(q, at::kFloat, per));
        at::Tensor gathered = at::zeros({per * n});
        tree->gather(parts[me], gathered, root);
        if (me == root) report.expect(at::equal(gathered, at::cat(parts)), label("tree gather", at::kFloat, per));
        at::Tensor whole = input(root, at::kFloat, per * n), piece = at::zeros({per});
        tree->scatter(whole, piece, root);
        report.expect(at::equal(piece, whole.slice(0, me * per, (me + 1) * per)), label("tree scatter", at::kFloat, per));
      }
    }
  }

  if (obj->allocations() != reserved)
    report.failures.push_back(report.who + ": scratch was allocated again after reserve() (" +
                              std::to_string(obj->allocations() - reserved) + " times) on rank " + std::to_string(me));
  return report.failures;
}

}  // namespace crosstrain::testing
