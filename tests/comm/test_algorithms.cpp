// Our collective algorithms against reduce_reference, ranks as threads, world sizes 1-8 (non-powers of two
// included), sizes 0, 1, odd and large; every rank must end with the same bits.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <mutex>

#include "conformance.h"
#include "crosstrain/comm/algorithms.h"
#include "crosstrain/comm/fake.h"
#include "crosstrain/comm/reference.h"

using namespace crosstrain;
using comm::ReduceOp;
namespace algo = comm::algo;

namespace {

const std::vector<int64_t> kSizes{0, 1, 7, 1000, 4099};

at::Tensor input(int rank, int64_t numel, at::ScalarType dtype, int salt) {
  return crosstrain::testing::conformance_input(rank, dtype, numel, salt);
}

void check_all_reduce(int n, algo::Algorithm a, at::ScalarType dtype) {
  for (int64_t numel : kSizes)
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
      std::vector<at::Tensor> all;
      for (int r = 0; r < n; ++r) all.push_back(input(r, numel, dtype, 3));
      at::Tensor want = comm::reduce_reference(all, op);
      std::vector<at::Tensor> got(n);
      comm::FakeWorld::run(n, [&](comm::Communicator& c) {
        at::Tensor t = input(c.rank(), numel, dtype, 3);
        if (a == algo::Algorithm::Hierarchical) {
          const int g = n % 2 == 0 ? 2 : 1;
          auto h = algo::make_hierarchy(c, g);
          algo::hierarchical_all_reduce(c, h, t, op);
        } else if (a == algo::Algorithm::Ring) {
          algo::ring_all_reduce(c, t, op);
        } else if (a == algo::Algorithm::Tree) {
          algo::tree_all_reduce(c, t, op);
        } else {
          algo::halving_doubling_all_reduce(c, t, op);
        }
        got[c.rank()] = t;
      });
      for (int r = 0; r < n; ++r) {
        EXPECT_TRUE(at::allclose(got[r].to(at::kDouble), want.to(at::kDouble), 1e-5, 1e-6))
            << algo::to_string(a) << " n=" << n << " numel=" << numel << " op=" << comm::to_string(op) << " rank " << r;
        EXPECT_TRUE(at::equal(got[r], got[0])) << "ranks disagree: " << algo::to_string(a) << " n=" << n;
      }
    }
}

}  // namespace

class Algorithms : public ::testing::TestWithParam<int> {};

TEST_P(Algorithms, AllReduce) {
  for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling,
                 algo::Algorithm::Hierarchical})
    for (auto dtype : {at::kFloat, at::kLong}) check_all_reduce(GetParam(), a, dtype);
}

TEST_P(Algorithms, ReduceScatterAllGatherAllToAllBroadcast) {
  const int n = GetParam();
  for (int64_t per : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{1027}}) {
    comm::FakeWorld::run(n, [&](comm::Communicator& c) {
      const int r = c.rank();
      std::vector<at::Tensor> full;
      for (int q = 0; q < n; ++q) full.push_back(input(q, per * n, at::kFloat, 9));
      at::Tensor out = at::zeros({per});
      algo::ring_reduce_scatter(c, full[r], out, ReduceOp::Sum);
      at::Tensor want = comm::reduce_reference(full, ReduceOp::Sum).slice(0, r * per, (r + 1) * per);
      EXPECT_TRUE(at::allclose(out, want, 1e-5, 1e-6)) << "reduce-scatter n=" << n << " per=" << per;

      std::vector<at::Tensor> parts;
      for (int q = 0; q < n; ++q) parts.push_back(input(q, per, at::kFloat, 4));
      at::Tensor gathered = at::zeros({per * n});
      algo::ring_all_gather(c, parts[r], gathered);
      EXPECT_TRUE(at::equal(gathered, at::cat(parts))) << "all-gather n=" << n;

      std::vector<at::Tensor> mine, expect;
      for (int j = 0; j < n; ++j) mine.push_back(input(r * n + j, per, at::kFloat, 5));
      for (int q = 0; q < n; ++q) expect.push_back(input(q * n + r, per, at::kFloat, 5));
      at::Tensor a2a = at::zeros({per * n});
      algo::pairwise_all_to_all(c, at::cat(mine), a2a);
      EXPECT_TRUE(at::equal(a2a, at::cat(expect))) << "all-to-all n=" << n;

      for (int root : {0, n - 1}) {
        at::Tensor b = r == root ? input(root, per * 3, at::kFloat, 6) : at::zeros({per * 3});
        algo::tree_broadcast(c, b, root);
        EXPECT_TRUE(at::equal(b, input(root, per * 3, at::kFloat, 6))) << "tree broadcast n=" << n;
        at::Tensor b2 = r == root ? input(root, per * 3, at::kFloat, 8) : at::zeros({per * 3});
        algo::ring_broadcast(c, b2, root, 4);
        EXPECT_TRUE(at::equal(b2, input(root, per * 3, at::kFloat, 8))) << "ring broadcast n=" << n;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Algorithms, ::testing::Range(1, 9));

TEST(Algorithms, NamesAndErrors) {
  EXPECT_EQ(algo::parse_algorithm("hd"), algo::Algorithm::HalvingDoubling);
  EXPECT_THROW(algo::parse_algorithm("butterfly"), UsageError);
  comm::FakeWorld::run(3, [](comm::Communicator& c) { EXPECT_THROW(algo::make_hierarchy(c, 2), UsageError); });
}
