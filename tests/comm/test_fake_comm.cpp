// The collective suite over the in-process back end, world sizes 1 to 8, plus its failure behaviour.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <functional>

#include "conformance.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/backends/shm.h"

#include <thread>

using namespace crosstrain;
using comm::FakeWorld;
using comm::Millis;

class FakeConformance : public ::testing::TestWithParam<int> {};

TEST_P(FakeConformance, EveryCollectiveMatchesReference) {
  const int n = GetParam();
  std::vector<std::vector<std::string>> failures(n);
  FakeWorld::run(n, [&](comm::Communicator& c) { failures[c.rank()] = crosstrain::testing::run_conformance(c); });
  for (int r = 0; r < n; ++r)
    for (const auto& f : failures[r]) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FakeConformance, ::testing::Range(1, 9));

TEST(FakeComm, MissingRankTimesOutNamingIt) {
  auto start = std::chrono::steady_clock::now();
  try {
    FakeWorld::run(3, [](comm::Communicator& c) {
      c.set_step(42);
      if (c.rank() == 2) return;  // never joins
      at::Tensor t = at::ones({4});
      c.all_reduce(t, comm::ReduceOp::Sum)->wait();
    }, Millis(300));
    FAIL() << "expected a timeout";
  } catch (const CommError& e) {
    std::string what = e.what();
    EXPECT_TRUE(e.timed_out());
    EXPECT_NE(what.find("[rank 0]"), std::string::npos) << what;
    EXPECT_NE(what.find("allreduce(sum)"), std::string::npos) << what;
    EXPECT_NE(what.find("group 'world'"), std::string::npos) << what;
    EXPECT_NE(what.find("peer 2"), std::string::npos) << what;
    EXPECT_NE(what.find("step 42"), std::string::npos) << what;
    EXPECT_NE(what.find("timeout 300 ms"), std::string::npos) << what;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(FakeComm, MismatchedCollectivesAreReported) {
  try {
    FakeWorld::run(2, [](comm::Communicator& c) {
      at::Tensor t = at::ones({4});
      if (c.rank() == 0) c.all_reduce(t, comm::ReduceOp::Sum)->wait();
      else c.broadcast(t, 0)->wait();
    }, Millis(2000));
    FAIL() << "expected a mismatch error";
  } catch (const CommError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("mismatched"), std::string::npos) << what;
  }
}

TEST(FakeComm, RecvWithoutSenderTimesOut) {
  try {
    FakeWorld::run(2, [](comm::Communicator& c) {
      if (c.rank() == 1) return;
      at::Tensor t = at::zeros({3});
      c.recv(t, 1, 5)->wait();
    }, Millis(200));
    FAIL() << "expected a timeout";
  } catch (const CommError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("recv(tag 5)"), std::string::npos) << what;
    EXPECT_NE(what.find("peer 1"), std::string::npos) << what;
  }
}

TEST(FakeComm, BadArgumentsNameTheOperation) {
  FakeWorld world(2);
  auto c = world.communicator(0);
  at::Tensor small = at::zeros({3}), big = at::zeros({5});
  EXPECT_THROW(c->all_gather(small, big), CommError);
  EXPECT_THROW(c->broadcast(small, 2), CommError);
  EXPECT_THROW(c->send(small, 0, 1), CommError);
  at::Tensor strided = at::zeros({4, 4}).t();
  EXPECT_THROW(c->all_reduce(strided, comm::ReduceOp::Sum), CommError);
  at::Tensor ints = at::zeros({6}, at::kInt);
  try {
    c->reduce_scatter(big, ints, comm::ReduceOp::Sum);
    FAIL();
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("reducescatter"), std::string::npos);
  }
  EXPECT_THROW(c->split({0, 0}), CommError);
  EXPECT_THROW(FakeWorld(0), UsageError);
}

TEST(FakeComm, AsyncOperationsOverlap) {
  // Two all-reduces in flight at once, waited in reverse order.
  FakeWorld::run(4, [](comm::Communicator& c) {
    at::Tensor a = at::full({8}, 1.0), b = at::full({8}, 2.0);
    auto wa = c.all_reduce(a, comm::ReduceOp::Sum);
    auto wb = c.all_reduce(b, comm::ReduceOp::Max);
    wb->wait();
    wa->wait();
    EXPECT_TRUE(wa->is_completed());
    EXPECT_EQ(a[0].item<double>(), 4.0);
    EXPECT_EQ(b[0].item<double>(), 2.0);
  });
}

// The shared-memory all-reduce in front of the in-process back end (threads of one process are on one host).
class ShmConformance : public ::testing::TestWithParam<int> {};

TEST_P(ShmConformance, EveryCollectiveMatchesReference) {
  const int n = GetParam();
  FakeWorld world(n, Millis(60000));
  std::vector<std::vector<std::string>> failures(n);
  std::vector<std::string> backends(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::with_shared_memory(world.communicator(r), 1 << 20);  // small rounds: several per buffer
      backends[r] = c->backend();
      crosstrain::testing::ConformanceOptions options;
      options.all_dtypes = false;
      failures[r] = crosstrain::testing::run_conformance(*c, options);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(backends[r], "fake+shm");
    for (const auto& f : failures[r]) ADD_FAILURE() << f;
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmConformance, ::testing::Values(2, 3, 8));

TEST(ShmComm, SilentPeerTimesOutNamingIt) {
  FakeWorld world(2, Millis(300));
  std::string error;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::with_shared_memory(world.communicator(r));
      if (r == 1) return;
      at::Tensor t = at::ones({8});
      try {
        c->all_reduce(t, comm::ReduceOp::Sum)->wait();
      } catch (const CommError& e) {
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(error.find("[rank 0] allreduce(sum)"), std::string::npos) << error;
  EXPECT_NE(error.find("peer 1"), std::string::npos) << error;
}

// Rank 1 never joins the all-reduce (it runs `rank1` instead); rank 0's error and how long it waited.
struct SilentPeerWait {
  std::string error;
  double waited_s = -1;
};
SilentPeerWait wait_for_silent_peer(Millis timeout, std::function<bool()> abandoned, std::function<void()> rank1) {
  FakeWorld world(2, timeout);
  SilentPeerWait out;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::with_shared_memory(world.communicator(r), 1 << 20, abandoned);
      if (r == 1) return rank1();
      at::Tensor t = at::ones({8});
      const auto start = std::chrono::steady_clock::now();
      try {
        c->all_reduce(t, comm::ReduceOp::Sum)->wait();
      } catch (const CommError& e) {
        out.error = e.what();
      }
      out.waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    });
  for (auto& t : threads) t.join();
  return out;
}

// With every core busy, each sched_yield of the waiting rank can give its core away for milliseconds: the wait
// still looks at its deadline (and at dead peers) by the clock, so it ends near the group timeout.
TEST(ShmComm, SilentPeerTimesOutOnTimeWhileOtherThreadsHogTheCores) {
  std::atomic<bool> hog{true};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 6; ++i)
    hogs.emplace_back([&] {
      volatile uint64_t x = 0;
      while (hog.load(std::memory_order_relaxed)) x = x + 1;
    });
  const SilentPeerWait w = wait_for_silent_peer(Millis(300), {}, [] {});
  hog = false;
  for (auto& t : hogs) t.join();
  EXPECT_NE(w.error.find("peer 1"), std::string::npos) << w.error;
  EXPECT_LT(w.waited_s, 5.0) << "the 0.3 s timeout was noticed only after " << w.waited_s << " s";
}

// Elastic training abandons a group when its generation ends: a rank still waiting in a shared-memory all-reduce
// for a peer that has left the call stops waiting at once, well before the group timeout.
TEST(ShmComm, AnAbandonedGroupEndsTheWaitAtOnce) {
  std::atomic<bool> ended{false};
  const SilentPeerWait w = wait_for_silent_peer(Millis(30000), [&] { return ended.load(); }, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ended = true;  // the generation ended: rank 1 went on without the all-reduce
  });
  EXPECT_NE(w.error.find("abandoned while this rank waited for rank 1"), std::string::npos) << w.error;
  EXPECT_LT(w.waited_s, 3.0) << "the 30 s timeout, not the abandonment, ended the wait";
}
