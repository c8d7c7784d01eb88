// Our collective algorithms against reduce_reference, ranks as threads, world sizes 1-8 (non-powers of two
// included), sizes 0, 1, odd and large, every collective of every algorithm (hierarchical with every group size
// that divides the world); results must match the reference bit for bit, so every rank ends with the same bits.
// The same checks run over Gloo in real processes (gloo_algorithms_np*).
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <mutex>

#include "algorithm_checks.h"
#include "conformance.h"
#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/reference.h"

using namespace crosstrain;
using comm::ReduceOp;
namespace algo = comm::algo;

namespace {

at::Tensor input(int rank, int64_t numel, at::ScalarType dtype, int salt) {
  return crosstrain::testing::conformance_input(rank, dtype, numel, salt);
}

}  // namespace

class Algorithms : public ::testing::TestWithParam<std::tuple<int, algo::Algorithm>> {};

TEST_P(Algorithms, EveryCollectiveMatchesTheReference) {
  const auto [n, a] = GetParam();
  for (const auto& v : crosstrain::testing::algorithm_variants(a, n)) {
    std::mutex mutex;
    std::vector<std::string> failures;
    comm::FakeWorld::run(n, [&](comm::Communicator& c) {
      auto mine = crosstrain::testing::check_algorithm(c, v);
      std::lock_guard<std::mutex> lock(mutex);
      failures.insert(failures.end(), mine.begin(), mine.end());
    });
    for (const auto& f : failures) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Algorithms,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(algo::Algorithm::Ring, algo::Algorithm::Tree,
                                                              algo::Algorithm::HalvingDoubling,
                                                              algo::Algorithm::Hierarchical, algo::Algorithm::Builtin)),
                         [](const auto& info) {
                           std::string name = algo::to_string(std::get<1>(info.param));
                           return name + "_np" + std::to_string(std::get<0>(info.param));
                         });

// The free functions of the first version stay as one-shot wrappers.
class AlgorithmWrappers : public ::testing::TestWithParam<int> {};

TEST_P(AlgorithmWrappers, FreeFunctionsStillWork) {
  const int n = GetParam();
  for (int64_t per : {int64_t{0}, int64_t{5}, int64_t{1027}}) {
    comm::FakeWorld::run(n, [&](comm::Communicator& c) {
      const int r = c.rank();
      std::vector<at::Tensor> full;
      for (int q = 0; q < n; ++q) full.push_back(input(q, per * n, at::kFloat, 9));
      const at::Tensor sum = comm::reduce_reference(full, ReduceOp::Sum);
      for (int which = 0; which < 4; ++which) {
        at::Tensor t = full[r].clone();
        if (which == 0) algo::ring_all_reduce(c, t, ReduceOp::Sum);
        if (which == 1) algo::tree_all_reduce(c, t, ReduceOp::Sum);
        if (which == 2) algo::halving_doubling_all_reduce(c, t, ReduceOp::Sum);
        if (which == 3) {
          auto h = algo::make_hierarchy(c, n % 2 == 0 ? 2 : 1);
          algo::hierarchical_all_reduce(c, h, t, ReduceOp::Sum);
        }
        EXPECT_TRUE(at::equal(t, sum)) << "all-reduce wrapper " << which << " n=" << n << " per=" << per;
      }
      at::Tensor out = at::zeros({per});
      algo::ring_reduce_scatter(c, full[r], out, ReduceOp::Sum);
      EXPECT_TRUE(at::equal(out, sum.slice(0, r * per, (r + 1) * per))) << "reduce-scatter n=" << n;

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
        at::Tensor b3 = full[r].clone();
        algo::tree_reduce(c, b3, root, ReduceOp::Sum);
        if (r == root) EXPECT_TRUE(at::equal(b3, sum)) << "tree reduce n=" << n;
      }
    });
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AlgorithmWrappers, ::testing::Values(1, 2, 3, 5, 8));

TEST(Algorithms, ScratchIsAllocatedOnceAndReused) {
  for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling,
                 algo::Algorithm::Hierarchical}) {
    comm::FakeWorld::run(6, [&](comm::Communicator& c) {
      algo::AlgorithmOptions o;
      o.group_size = 3;
      auto obj = algo::make_algorithm(a, c, o);
      EXPECT_EQ(obj->allocations(), 0) << obj->name() << ": nothing is allocated before the first call";
      // Without reserve: the first call allocates what it needs, the next ones of the same size nothing.
      at::Tensor t = at::ones({6000});
      obj->all_reduce(t, ReduceOp::Sum);
      const int after_first = obj->allocations();
      for (int i = 0; i < 3; ++i) obj->all_reduce(t, ReduceOp::Sum);
      EXPECT_EQ(obj->allocations(), after_first) << obj->name();
      EXPECT_TRUE(at::equal(t, at::full({6000}, 6.0 * 6 * 6 * 6))) << obj->name();
      // With options.reserve_numel: allocated by the constructor, never again for buffers up to that size.
      o.reserve_numel = 6 * 1000;
      auto reserved = algo::make_algorithm(a, c, o);
      const int base = reserved->allocations();
      EXPECT_GT(reserved->scratch_bytes(), 0) << reserved->name();
      at::Tensor in = at::ones({6 * 1000}), out = at::zeros({1000}), gathered = at::zeros({6 * 1000});
      for (int64_t numel : {int64_t{6000}, int64_t{17}, int64_t{0}}) {
        at::Tensor x = at::ones({numel});
        reserved->all_reduce(x, ReduceOp::Avg);
        reserved->broadcast(x, 4);
      }
      reserved->reduce_scatter(in, out, ReduceOp::Sum);
      reserved->all_gather(out, gathered);
      EXPECT_TRUE(at::equal(gathered, at::full({6000}, 6.0))) << reserved->name();
      EXPECT_EQ(reserved->allocations(), base) << reserved->name() << " allocated after reserve";
    });
  }
}

TEST(Algorithms, EveryWaitHasTheObjectsTimeout) {
  for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling}) {
    comm::FakeWorld::run(3, [&](comm::Communicator& c) {
      algo::AlgorithmOptions o;
      o.timeout = comm::Millis(200);  // the communicator's is 30 s
      auto obj = algo::make_algorithm(a, c, o);
      EXPECT_EQ(obj->timeout(), comm::Millis(200));
      if (c.rank() == 2) return;  // never joins
      at::Tensor t = at::ones({100});
      const auto start = std::chrono::steady_clock::now();
      try {
        obj->all_reduce(t, ReduceOp::Sum);
        ADD_FAILURE() << obj->name() << ": all-reduce without rank 2 returned";
      } catch (const CommError& e) {
        EXPECT_TRUE(e.timed_out()) << e.what();
      }
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << obj->name();
    });
  }
}

TEST(Algorithms, UseOnlyTheirOwnTags) {
  // A user message in flight on another tag is neither taken nor disturbed by the algorithms.
  comm::FakeWorld::run(5, [](comm::Communicator& c) {
    const int n = c.size(), r = c.rank();
    c.send(at::full({3}, r, at::kFloat), (r + 1) % n, 5)->wait();
    algo::AlgorithmOptions o;
    o.tag = 1000;
    for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling}) {
      auto obj = algo::make_algorithm(a, c, o);
      EXPECT_EQ(obj->tag(), 1000);
      at::Tensor t = at::ones({11});
      obj->all_reduce(t, ReduceOp::Sum);
      EXPECT_TRUE(at::equal(t, at::full({11}, 5.0f)));
    }
    at::Tensor got = at::zeros({3});
    c.recv(got, (r + n - 1) % n, 5)->wait();
    EXPECT_TRUE(at::equal(got, at::full({3}, (r + n - 1) % n, at::kFloat)));
  });
}

TEST(Algorithms, NamesAndErrors) {
  EXPECT_EQ(algo::parse_algorithm("hd"), algo::Algorithm::HalvingDoubling);
  EXPECT_EQ(algo::parse_algorithm("halving-doubling"), algo::Algorithm::HalvingDoubling);
  EXPECT_THROW(algo::parse_algorithm("butterfly"), UsageError);
  comm::FakeWorld::run(3, [](comm::Communicator& c) {
    EXPECT_THROW(algo::make_hierarchy(c, 2), UsageError);
    EXPECT_THROW(algo::make_algorithm(algo::Algorithm::Hierarchical, c), UsageError);  // no group size
    algo::AlgorithmOptions o;
    o.group_size = 1;
    o.across = algo::Algorithm::Hierarchical;
    EXPECT_THROW(algo::make_algorithm(algo::Algorithm::Hierarchical, c, o), UsageError);
    o.tag = -1;
    EXPECT_THROW(algo::make_algorithm(algo::Algorithm::Ring, c, o), UsageError);
    for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling}) {
      auto obj = algo::make_algorithm(a, c);
      at::Tensor in = at::ones({10}), out = at::zeros({3});
      EXPECT_THROW(obj->reduce_scatter(in, out, ReduceOp::Sum), UsageError) << obj->name();  // 10 != 3 x 3
      EXPECT_THROW(obj->all_gather(out, in), UsageError) << obj->name();
      at::Tensor strided = at::ones({4, 4}).t();
      EXPECT_THROW(obj->all_reduce(strided, ReduceOp::Sum), UsageError) << obj->name();
      at::Tensor t = at::ones({4});
      EXPECT_THROW(obj->broadcast(t, 3), UsageError) << obj->name();
    }
  });
}

TEST(CostModel, DetectsTheHostAndCalibratesOverACommunicator) {
  std::mutex mutex;
  std::vector<comm::Link> links;
  comm::FakeWorld::run(3, [&](comm::Communicator& c) {
    auto plain = comm::detect_local_topology(c, /*calibrate=*/false);
    ASSERT_EQ(plain.hosts.size(), 1u);  // every rank is a thread of this process
    EXPECT_EQ(plain.hosts[0].name, comm::local_hostname());
    EXPECT_EQ(plain.hosts[0].ranks, 3);
    EXPECT_EQ(plain.hosts[0].cores, comm::local_core_count());
    comm::CalibrationOptions o;
    o.sizes = {4, 4096, 65536};
    o.rounds = 5;
    auto measured = comm::detect_local_topology(c, /*calibrate=*/true, o);
    const comm::Link& l = measured.host;
    EXPECT_TRUE(std::isfinite(l.latency_s) && l.latency_s >= 0);
    EXPECT_GT(l.bandwidth_Bps, 0);
    EXPECT_GT(l.exchange_latency_s, 0);
    EXPECT_GT(l.exchange_bandwidth_Bps, 0);
    EXPECT_GT(l.reduce_Bps, 0);
    std::lock_guard<std::mutex> lock(mutex);
    links.push_back(l);
  });
  ASSERT_EQ(links.size(), 3u);
  for (const auto& l : links) {  // every rank got the same link
    EXPECT_EQ(l.latency_s, links[0].latency_s);
    EXPECT_EQ(l.bandwidth_Bps, links[0].bandwidth_Bps);
    EXPECT_EQ(l.reduce_Bps, links[0].reduce_Bps);
  }
  comm::FakeWorld::run(1, [](comm::Communicator& c) { EXPECT_THROW(comm::calibrate_link(c), UsageError); });
}
