// The parameter-server skeleton (comm/param_server_core.h) with the smallest payload there is, a counter per
// server, over ranks as threads: every request reaches its server's thread and nothing else; the clocks and
// version follow the pushes; the goodbye ends every server thread; a server thread's failure is rethrown by the
// worker of its rank naming the server and the worker; no call after finish().
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/param_server_core.h"
#include "crosstrain/core/error.h"

using namespace crosstrain;
using comm::ParamServerCore;

namespace {

constexpr int kTagRequest = 7301, kTagAck = 7302;
constexpr int64_t kAdd = 1;

// A server holding one counter: a request adds its word 2 to it and acks with the clocks after the push.
class CounterServer {
 public:
  CounterServer(comm::Communicator& group, comm::Millis timeout, int64_t fail_on = -1)
      : fail_on_(fail_on), core_(group, timeout, "counter server", kTagRequest, 3) {
    core_.start([this](int worker, const at::Tensor& header) { serve(worker, header); });
  }

  // Adds `amount` to every server's counter at `clock`; returns the slowest clock any server reported.
  ParamServerCore::Clocks add_everywhere(int64_t amount, int64_t clock) {
    core_.check_usable("add");
    std::vector<at::Tensor> requests, acks;
    std::vector<comm::WorkPtr> works;
    for (int s = 0; s < core_.size(); ++s) {
      if (s == core_.rank()) continue;
      requests.push_back(core_.header(kAdd, clock));
      requests.back().data_ptr<int64_t>()[2] = amount;
      acks.push_back(at::zeros({3}, at::kLong));
      works.push_back(core_.group().send(requests.back(), s, kTagRequest));
      works.push_back(core_.group().recv(acks.back(), s, kTagAck));
    }
    ParamServerCore::Clocks slowest = apply(core_.rank(), amount, clock);
    for (auto& w : works) w->wait(core_.timeout());
    for (const auto& a : acks)
      if (a[1].item<int64_t>() < slowest.min_clock)
        slowest = {a[0].item<int64_t>(), a[1].item<int64_t>(), static_cast<int>(a[2].item<int64_t>())};
    core_.rethrow_failure();
    return slowest;
  }
  int64_t counter() const {
    std::lock_guard<std::mutex> lock(core_.mutex());
    return counter_;
  }
  ParamServerCore& core() { return core_; }

 private:
  ParamServerCore::Clocks apply(int worker, int64_t amount, int64_t clock) {
    std::lock_guard<std::mutex> lock(core_.mutex());
    counter_ += amount;
    return core_.record_push_locked(worker, clock);
  }
  void serve(int worker, const at::Tensor& header) {
    const int64_t* h = header.data_ptr<int64_t>();
    if (h[0] != kAdd) throw Error("unknown request type " + std::to_string(h[0]));
    if (h[2] == fail_on_) throw Error("cannot add " + std::to_string(h[2]));
    const ParamServerCore::Clocks c = apply(worker, h[2], h[1]);
    at::Tensor ack = at::tensor({c.version, c.min_clock, static_cast<int64_t>(c.slowest)}, at::kLong);
    core_.group().send(ack, worker, kTagAck)->wait(core_.timeout());
    core_.count_bytes(24);
  }

  int64_t fail_on_;
  int64_t counter_ = 0;  // under core_.mutex()
  ParamServerCore core_;
};

}  // namespace

TEST(ParamServerCore, EveryRequestReachesItsServerAndTheClocksFollowThePushes) {
  for (int world : {1, 2, 3, 4}) {
    std::vector<int64_t> counters(world), versions(world), min_clocks(world), slowest(world);
    comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
      CounterServer server(comm, comm::Millis(5000));
      // Rank r pushes r + 1 once per round, at clock round + 1, except the last rank, which stops a round early.
      const int rounds = 3, mine = comm.rank() == world - 1 && world > 1 ? rounds - 1 : rounds;
      for (int round = 0; round < mine; ++round) server.add_everywhere(comm.rank() + 1, round + 1);
      server.core().finish();
      const auto c = server.core().clocks();
      counters[comm.rank()] = server.counter();
      versions[comm.rank()] = c.version;
      min_clocks[comm.rank()] = c.min_clock;
      slowest[comm.rank()] = c.slowest;
    });
    int64_t expected = 0, pushes = 0;
    for (int r = 0; r < world; ++r) {
      const int n = r == world - 1 && world > 1 ? 2 : 3;
      expected += n * (r + 1);
      pushes += n;
    }
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(counters[r], expected) << "world " << world << ", server " << r;
      EXPECT_EQ(versions[r], pushes) << "world " << world << ", server " << r;
      EXPECT_EQ(min_clocks[r], world > 1 ? 2 : 3) << "world " << world << ", server " << r;
      EXPECT_EQ(slowest[r], world - 1) << "world " << world << ", server " << r;
    }
  }
}

TEST(ParamServerCore, AServerThreadsFailureIsRethrownNamingTheServerAndTheWorker) {
  std::string message;
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    CounterServer server(comm, comm::Millis(1000), /*fail_on=*/7);
    if (comm.rank() == 1) {
      try {
        server.add_everywhere(7, 1);  // rank 0's server thread throws; our ack never comes
      } catch (const std::exception&) {
      }
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    try {
      server.core().check_usable("add");
    } catch (const Error& e) {
      message = e.what();
    }
    try {
      server.core().finish();  // the goodbye ends rank 1's server thread; the failure is rethrown again
    } catch (const Error&) {
    }
  });
  EXPECT_NE(message.find("counter server of rank 0, serving worker 1: cannot add 7"), std::string::npos) << message;
}

TEST(ParamServerCore, AWorkerThatNeverSaysGoodbyeEndsItsServerThreadWithinTwiceTheTimeout) {
  std::string message;
  double seconds = 0;
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    CounterServer server(comm, comm::Millis(200));
    if (comm.rank() == 1) return;  // no request, no goodbye: gone
    const auto start = std::chrono::steady_clock::now();
    while (message.empty() && std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
      try {
        server.core().rethrow_failure();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      } catch (const Error& e) {
        message = e.what();
      }
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_NE(message.find("serving worker 1: waiting for its next request"), std::string::npos) << message;
  EXPECT_LT(seconds, 2.0);
}

TEST(ParamServerCore, NoCallAfterFinish) {
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    CounterServer server(comm, comm::Millis(2000));
    server.core().finish();
    server.core().finish();  // idempotent
    EXPECT_THROW(server.add_everywhere(1, 1), Error);
  });
}
