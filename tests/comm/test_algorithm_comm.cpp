// comm.algo: the algorithm communicator against the conformance suite (every collective, every dtype it
// routes, sizes 0 to > 1 MiB), ranks as threads, for each algorithm and world sizes 2-8; calls started together
// finish in order; sub-groups are wrapped too; errors and auto's choices.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>
#include <thread>

#include "conformance.h"
#include "crosstrain/comm/algorithms/communicator.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/backends/shm.h"

using namespace crosstrain;
using comm::FakeWorld;
using comm::Millis;
using comm::ReduceOp;

namespace {

// The settings with_algorithms and validate read; the rest of [comm] keeps its defaults.
comm::CommConfig algorithms(const std::string& algo, const std::string& topology = "") {
  comm::CommConfig config;
  config.algo = algo;
  config.topology = topology;
  return config;
}

// Runs `body` on every rank of a world of n threads, each with its own wrapped communicator.
void on_ranks(int n, const comm::CommConfig& config, const std::function<void(comm::Communicator&)>& body,
              bool shared_memory = false) {
  FakeWorld world(n, Millis(60000));
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        auto inner = world.communicator(r);
        if (shared_memory) inner = comm::with_shared_memory(std::move(inner), 1 << 20);
        auto c = comm::with_algorithms(std::move(inner), config);
        body(*c);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace

class AlgorithmComm : public ::testing::TestWithParam<std::tuple<int, std::string>> {};

TEST_P(AlgorithmComm, EveryCollectiveMatchesReference) {
  const auto [n, algo] = GetParam();
  std::mutex mutex;
  std::vector<std::string> failures;
  on_ranks(n, algorithms(algo), [&](comm::Communicator& c) {
    EXPECT_EQ(c.backend(), "fake+" + algo);
    crosstrain::testing::ConformanceOptions options;
    options.all_dtypes = false;
    auto mine = crosstrain::testing::run_conformance(c, options);
    std::lock_guard<std::mutex> lock(mutex);
    failures.insert(failures.end(), mine.begin(), mine.end());
  });
  for (const auto& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AlgorithmComm,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8),
                                            ::testing::Values("ring", "tree", "hd", "hierarchical", "auto")),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_np" + std::to_string(std::get<0>(info.param));
                         });

// Several calls started before any is waited for run in order, asynchronously, with the right results; a
// sub-group from split() runs our algorithms too.
TEST(AlgorithmComm, CallsInFlightFinishInOrderAndSubGroupsAreWrapped) {
  const int n = 4;
  on_ranks(n, algorithms("ring"), [&](comm::Communicator& c) {
    std::vector<at::Tensor> buffers;
    std::vector<comm::WorkPtr> works;
    for (int i = 0; i < 6; ++i) {
      // Sizes on both sides of the inline limit (64 KiB): some run in the caller, some on the worker.
      buffers.push_back(at::full({i % 2 ? 5 : 70000}, static_cast<float>(c.rank() + i)));
      works.push_back(c.all_reduce(buffers.back(), ReduceOp::Sum));
    }
    for (int i = 0; i < 6; ++i) {
      works[i]->wait();
      const float want = static_cast<float>(n * (n - 1) / 2 + n * i);
      EXPECT_TRUE(at::all(buffers[i].eq(want)).item<bool>()) << "call " << i << " on rank " << c.rank();
    }
    auto sub = c.split({1, 3});
    if (c.rank() == 1 || c.rank() == 3) {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->backend(), "fake+ring");
      at::Tensor t = at::full({1001}, static_cast<double>(c.rank()), at::kDouble);
      sub->all_reduce(t, ReduceOp::Avg)->wait();
      EXPECT_TRUE(at::all(t.eq(2.0)).item<bool>());
    } else {
      EXPECT_EQ(sub, nullptr);
    }
  });
}

// auto leaves same-host float all-reduces to the shared-memory path; other collectives still use ours.
TEST(AlgorithmComm, AutoKeepsTheSharedMemoryAllReduce) {
  on_ranks(
      3, algorithms("auto"),
      [&](comm::Communicator& c) {
        EXPECT_EQ(c.backend(), "fake+shm+auto");
        crosstrain::testing::ConformanceOptions options;
        options.all_dtypes = false;
        for (const auto& f : crosstrain::testing::run_conformance(c, options)) ADD_FAILURE() << f;
      },
      /*shared_memory=*/true);
}

TEST(AlgorithmComm, BuiltinAndGroupsOfOneAreNotWrapped) {
  on_ranks(2, algorithms("builtin"), [&](comm::Communicator& c) { EXPECT_EQ(c.backend(), "fake"); });
  on_ranks(1, algorithms("ring"), [&](comm::Communicator& c) { EXPECT_EQ(c.backend(), "fake"); });
}

TEST(AlgorithmComm, BadSettingsAreNamed) {
  try {
    comm::validate(algorithms("fastest"));
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("comm.algo = \"fastest\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("auto"), std::string::npos) << e.what();
  }
  EXPECT_THROW(comm::validate(algorithms("auto", "/nonexistent/topology.toml")), UsageError);
  comm::CommConfig compressed;
  compressed.compression = "zip";  // [comm] is checked whole: the gradient codec too
  EXPECT_THROW(comm::validate(compressed), UsageError);
  const std::string path = ::testing::TempDir() + "/algo_topology.toml";
  std::ofstream(path) << "[links.host]\nlatency_us = 5\nbandwidth_gbps = 40\n"
                         "[links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n"
                         "[links.wan]\nlatency_us = 25000\nbandwidth_gbps = 0.1\n"
                         "[[hosts]]\nname = \"a\"\nranks = 2\n";
  EXPECT_NO_THROW(comm::validate(algorithms("auto", path)));
  // Links from the file: the group still works (all ranks on this host).
  on_ranks(2, algorithms("auto", path), [&](comm::Communicator& c) {
    at::Tensor t = at::full({300001}, 1.0f);
    c.all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_TRUE(at::all(t.eq(2.0f)).item<bool>());
  });
}

// Ranks that read different topology files would choose different algorithms and hang: every rank stops with a
// message instead. So does every rank when one cannot read the file.
TEST(AlgorithmComm, RanksMustReadTheSameTopology) {
  const std::string dir = ::testing::TempDir();
  auto write = [&](const std::string& name, double gbps) {
    std::ofstream(dir + name) << "[links.host]\nlatency_us = 5\nbandwidth_gbps = " << gbps << "\n"
                              << "[links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n"
                                 "[links.wan]\nlatency_us = 25000\nbandwidth_gbps = 0.1\n"
                                 "[[hosts]]\nname = \"a\"\nranks = 2\n";
    return dir + name;
  };
  const std::vector<std::string> differ{write("/topo_a.toml", 40), write("/topo_b.toml", 10)};
  const std::vector<std::string> missing{differ[0], dir + "/no_such_topology.toml"};
  for (const auto& files : {differ, missing}) {
    FakeWorld world(2, Millis(10000));
    std::vector<std::string> errors(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        try {
          comm::with_algorithms(world.communicator(r), algorithms("auto", files[r]));
        } catch (const UsageError& e) {
          errors[r] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    for (int r = 0; r < 2; ++r) EXPECT_NE(errors[r].find("topology"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

// A rank that never joins: the others fail with a CommError naming the operation, the peer and the step.
TEST(AlgorithmComm, SilentPeerTimesOutNamingIt) {
  FakeWorld world(2, Millis(300));
  std::string error;
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      auto c = comm::with_algorithms(world.communicator(r), algorithms("ring"));
      if (r == 1) return;
      c->set_step(7);  // passed on to the wrapped communicator, whose receive times out
      at::Tensor t = at::ones({100000});
      try {
        c->all_reduce(t, ReduceOp::Sum)->wait();
      } catch (const CommError& e) {
        error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_NE(error.find("[rank 0]"), std::string::npos) << error;
  EXPECT_NE(error.find("peer 1"), std::string::npos) << error;
  EXPECT_NE(error.find("step 7"), std::string::npos) << error;
}
