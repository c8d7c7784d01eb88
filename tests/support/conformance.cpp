#include "conformance.h"

#include <ATen/ATen.h>

#include <sstream>

#include "crosstrain/comm/reference.h"

namespace crosstrain::testing {
namespace {

using comm::ReduceOp;

std::vector<at::ScalarType> dtypes(bool all) {
  if (!all) return {at::kFloat, at::kLong, at::kBFloat16};
  return {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16, at::kChar, at::kByte, at::kShort,
          at::kInt,   at::kLong,   at::kBool, at::kComplexFloat, at::kComplexDouble};
}

bool close(const at::Tensor& got, const at::Tensor& want) {
  if (got.numel() != want.numel()) return false;
  if (got.numel() == 0) return true;
  auto g = got.reshape(-1), w = want.reshape(-1);
  if (at::isFloatingType(want.scalar_type()) || at::isComplexType(want.scalar_type())) {
    double tol = want.scalar_type() == at::kHalf || want.scalar_type() == at::kBFloat16 ? 1e-2 : 1e-6;
    if (at::isComplexType(want.scalar_type())) return at::allclose(at::view_as_real(g), at::view_as_real(w), tol, tol);
    return at::allclose(g.to(at::kDouble), w.to(at::kDouble), tol, tol);
  }
  return at::equal(g, w);
}

struct Checker {
  comm::Communicator& c;
  std::vector<std::string> failures;

  void expect(bool ok, const std::string& what, at::ScalarType dtype, int64_t numel) {
    if (ok) return;
    std::ostringstream out;
    out << "rank " << c.rank() << "/" << c.size() << " " << what << " dtype " << c10::toString(dtype) << " numel "
        << numel;
    failures.push_back(out.str());
  }

  // Runs `body`, turning an exception into a failure.
  template <typename Body>
  void guarded(const std::string& what, at::ScalarType dtype, int64_t numel, Body&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      expect(false, what + " threw: " + e.what(), dtype, numel);
    }
  }
};

bool reducible(at::ScalarType dtype, ReduceOp op) {
  if (dtype == at::kBool) return op != ReduceOp::Avg;
  if (at::isComplexType(dtype)) return op == ReduceOp::Sum || op == ReduceOp::Avg;
  return true;
}

}  // namespace

at::Tensor conformance_input(int rank, at::ScalarType dtype, int64_t numel, int salt, bool for_product) {
  auto idx = at::arange(numel, at::kLong);
  if (dtype == at::kBool) return (idx + rank + salt).remainder(3).eq(0);
  at::Tensor base = for_product ? (idx + rank + salt).remainder(2).add(1) : (idx * 7 + rank * 3 + salt).remainder(5);
  if (at::isComplexType(dtype)) {
    auto real_type = dtype == at::kComplexFloat ? at::kFloat : at::kDouble;
    at::Tensor imag = for_product ? at::zeros_like(base) : (idx + rank).remainder(3);
    return at::complex(base.to(real_type), imag.to(real_type));
  }
  return base.to(dtype);
}

std::vector<std::string> run_conformance(comm::Communicator& c, const ConformanceOptions& options) {
  Checker k{c, {}};
  const int n = c.size(), me = c.rank();
  int salt = 0;
  for (int64_t numel : options.sizes) {
    for (at::ScalarType dtype : dtypes(options.all_dtypes)) {
      if (numel > options.large_only_for_float && dtype != at::kFloat) continue;
      ++salt;
      auto input = [&](int rank, bool product = false) { return conformance_input(rank, dtype, numel, salt, product); };
      auto all_inputs = [&](bool product = false) {
        std::vector<at::Tensor> v;
        for (int r = 0; r < n; ++r) v.push_back(input(r, product));
        return v;
      };

      // all-reduce and reduce, every op the dtype supports
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Min, ReduceOp::Max, ReduceOp::Product}) {
        if (!reducible(dtype, op)) continue;
        const bool product = op == ReduceOp::Product;
        const std::string name = std::string(comm::to_string(op));
        at::Tensor want = comm::reduce_reference(all_inputs(product), op);
        k.guarded("allreduce(" + name + ")", dtype, numel, [&] {
          at::Tensor t = input(me, product);
          c.all_reduce(t, op)->wait();
          k.expect(close(t, want), "allreduce(" + name + ") wrong result", dtype, numel);
        });
        const int root = n - 1;
        k.guarded("reduce(" + name + ")", dtype, numel, [&] {
          at::Tensor t = input(me, product);
          c.reduce(t, root, op)->wait();
          if (me == root) k.expect(close(t, want), "reduce(" + name + ") wrong result on root", dtype, numel);
        });
      }
      // broadcast from the first and the last rank
      for (int root : {0, n - 1}) {
        k.guarded("broadcast", dtype, numel, [&] {
          at::Tensor t = me == root ? input(me) : at::zeros({numel}, at::TensorOptions().dtype(dtype));
          c.broadcast(t, root)->wait();
          k.expect(close(t, input(root)), "broadcast from " + std::to_string(root) + " wrong result", dtype, numel);
        });
      }
      at::Tensor concat = at::cat(all_inputs());
      k.guarded("allgather", dtype, numel, [&] {
        at::Tensor out = at::zeros({numel * n}, at::TensorOptions().dtype(dtype));
        c.all_gather(input(me), out)->wait();
        k.expect(close(out, concat), "allgather wrong result", dtype, numel);
      });
      k.guarded("gather", dtype, numel, [&] {
        const int root = n / 2;
        at::Tensor out = at::zeros({me == root ? numel * n : 0}, at::TensorOptions().dtype(dtype));
        c.gather(input(me), out, root)->wait();
        if (me == root) k.expect(close(out, concat), "gather wrong result on root", dtype, numel);
      });
      k.guarded("scatter", dtype, numel, [&] {
        const int root = n - 1;
        at::Tensor out = at::zeros({numel}, at::TensorOptions().dtype(dtype));
        at::Tensor in = me == root ? concat : at::Tensor();
        c.scatter(in, out, root)->wait();
        k.expect(close(out, input(me)), "scatter wrong result", dtype, numel);
      });
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        if (!reducible(dtype, op)) continue;
        k.guarded("reducescatter", dtype, numel, [&] {
          std::vector<at::Tensor> full;
          for (int r = 0; r < n; ++r) full.push_back(conformance_input(r, dtype, numel * n, salt));
          at::Tensor want = comm::reduce_reference(full, op).slice(0, me * numel, (me + 1) * numel);
          at::Tensor out = at::zeros({numel}, at::TensorOptions().dtype(dtype));
          c.reduce_scatter(full[me], out, op)->wait();
          k.expect(close(out, want), std::string("reducescatter(") + comm::to_string(op) + ") wrong result", dtype,
                   numel);
        });
      }
      k.guarded("alltoall", dtype, numel, [&] {
        // Rank r's slice j is conformance_input(r * n + j): rank me receives slice me of every rank.
        std::vector<at::Tensor> mine, want;
        for (int j = 0; j < n; ++j) mine.push_back(input(me * n + j));
        for (int r = 0; r < n; ++r) want.push_back(input(r * n + me));
        at::Tensor out = at::zeros({numel * n}, at::TensorOptions().dtype(dtype));
        c.all_to_all(at::cat(mine), out)->wait();
        k.expect(close(out, at::cat(want)), "alltoall wrong result", dtype, numel);
      });
      if (n > 1) {
        k.guarded("send/recv", dtype, numel, [&] {
          // A ring with two tags sent in one order and received in the other: tags must keep them apart.
          const int next = (me + 1) % n, prev = (me + n - 1) % n;
          auto s1 = c.send(input(me, false), next, 11);
          auto s2 = c.send(input(me + 100, false), next, 12);
          at::Tensor a = at::zeros({numel}, at::TensorOptions().dtype(dtype));
          at::Tensor b = at::zeros({numel}, at::TensorOptions().dtype(dtype));
          auto r2 = c.recv(b, prev, 12);
          auto r1 = c.recv(a, prev, 11);
          r2->wait();
          r1->wait();
          s1->wait();
          s2->wait();
          k.expect(close(a, input(prev)) && close(b, input(prev + 100)), "send/recv wrong result", dtype, numel);
        });
      }
    }
  }
  // A buffer larger than a shared-memory round (8 MiB): all-reduced in several rounds.
  k.guarded("large allreduce", at::kFloat, 3 << 20, [&] {
    at::Tensor t = conformance_input(me, at::kFloat, 3 << 20, 7);
    std::vector<at::Tensor> all;
    for (int r = 0; r < n; ++r) all.push_back(conformance_input(r, at::kFloat, 3 << 20, 7));
    c.all_reduce(t, ReduceOp::Sum)->wait();
    k.expect(close(t, comm::reduce_reference(all, ReduceOp::Sum)), "12 MiB allreduce wrong", at::kFloat, 3 << 20);
  });

  // Multi-dimensional buffers: a per-rank [3, 5] block and a full [n * 3, 5] buffer.
  k.guarded("2-d buffers", at::kFloat, 15, [&] {
    auto block = [&](int r) { return conformance_input(r, at::kFloat, 15, 99).view({3, 5}); };
    std::vector<at::Tensor> blocks;
    for (int r = 0; r < n; ++r) blocks.push_back(block(r));
    at::Tensor concat = at::cat(blocks);  // [n * 3, 5]
    at::Tensor gathered = at::zeros({n * 3, 5});
    c.all_gather(block(me), gathered)->wait();
    k.expect(close(gathered, concat), "allgather of [3, 5] blocks wrong", at::kFloat, 15);
    at::Tensor rooted = at::zeros({n * 3, 5});
    c.gather(block(me), rooted, 0)->wait();
    if (me == 0) k.expect(close(rooted, concat), "gather of [3, 5] blocks wrong", at::kFloat, 15);
    at::Tensor part = at::zeros({3, 5});
    c.scatter(me == 0 ? concat : at::Tensor(), part, 0)->wait();
    k.expect(close(part, block(me)), "scatter of [3, 5] blocks wrong", at::kFloat, 15);
    at::Tensor reduced = at::zeros({3, 5});
    c.reduce_scatter(concat, reduced, ReduceOp::Sum)->wait();
    k.expect(close(reduced, block(me) * n), "reducescatter of [n*3, 5] wrong", at::kFloat, 15);
  });

  // barrier and sub-groups: even and odd ranks, then everyone but rank 0
  try {
    c.barrier()->wait();
    std::vector<int> even, odd, rest;
    for (int r = 0; r < n; ++r) (r % 2 ? odd : even).push_back(r);
    for (int r = 1; r < n; ++r) rest.push_back(r);
    auto g_even = c.split(even);
    auto g_odd = odd.empty() ? nullptr : c.split(odd);
    auto mine = me % 2 ? std::move(g_odd) : std::move(g_even);
    const auto& members = me % 2 ? odd : even;
    if (!mine || mine->size() != static_cast<int>(members.size())) {
      k.failures.push_back("rank " + std::to_string(me) + ": split() returned no group or the wrong size");
    } else {
      at::Tensor t = at::full({3}, static_cast<float>(me));
      mine->all_reduce(t, ReduceOp::Sum)->wait();
      float want = 0;
      for (int r : members) want += static_cast<float>(r);
      if (t[2].item<float>() != want)
        k.failures.push_back("rank " + std::to_string(me) + ": sub-group allreduce gave " +
                             std::to_string(t[2].item<float>()) + ", expected " + std::to_string(want));
    }
    if (n > 1) {
      auto g_rest = c.split(rest);
      if ((me == 0) != (g_rest == nullptr))
        k.failures.push_back("rank " + std::to_string(me) + ": split() membership wrong for ranks 1..n-1");
      if (g_rest) {
        at::Tensor t = at::full({1}, 1.0f);
        g_rest->all_reduce(t, ReduceOp::Sum)->wait();
        if (t.item<float>() != static_cast<float>(n - 1))
          k.failures.push_back("rank " + std::to_string(me) + ": allreduce in ranks 1..n-1 wrong");
      }
    }
    c.barrier()->wait();
  } catch (const std::exception& e) {
    k.failures.push_back(std::string("groups threw: ") + e.what());
  }
  return k.failures;
}

}  // namespace crosstrain::testing
