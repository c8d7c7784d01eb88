// A generation's communicator (elastic/abortable.h): once a failure generation is published, every wait on it
// ends with GenerationEnded, point to point included, which Gloo can only report from inside its own wait.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "crosstrain/comm/init.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/elastic/abortable.h"
#include "crosstrain/elastic/membership.h"

using namespace crosstrain;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Two ranks of one Gloo group in this process, each wrapped as a generation's communicator that `ended` ends.
struct TwoRanks {
  std::shared_ptr<comm::Rendezvous> host = comm::Rendezvous::host("127.0.0.1", 0, 2, milliseconds(10000), 0);
  std::atomic<int64_t> ended{0};
  std::unique_ptr<comm::Communicator> rank0, rank1;
  TwoRanks() {
    auto other = std::async(std::launch::async, [&] {
      auto r = comm::Rendezvous::connect("127.0.0.1", host->port(), 1, 2, milliseconds(10000));
      return elastic::make_abortable(comm::make_gloo_communicator(r, 1, 2, milliseconds(10000), "g1"),
                                     [this] { return ended.load(); });
    });
    rank0 = elastic::make_abortable(comm::make_gloo_communicator(host, 0, 2, milliseconds(10000), "g1"),
                                    [this] { return ended.load(); });
    rank1 = other.get();
  }
};

}  // namespace

TEST(Abortable, PointToPointStillMovesTheData) {
  TwoRanks g;
  for (int round = 0; round < 3; ++round) {
    at::Tensor out = at::arange(5, at::kFloat) + round, in = at::zeros({5});
    auto sent = g.rank0->send(out, 1, round);
    g.rank1->recv(in, 0, round)->wait();
    sent->wait();
    EXPECT_TRUE(in.equal(out)) << "round " << round;
  }
}

TEST(Abortable, AReceiveFromAPeerThatNeverSendsEndsWithTheGeneration) {
  TwoRanks g;
  at::Tensor in = at::zeros({1 << 16});
  auto work = g.rank0->recv(in, 1, 0);  // rank 1 went to the next generation: nothing will come
  auto failure = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(milliseconds(300));
    g.ended = 3;
  });
  const auto start = Clock::now();
  try {
    work->wait();
    FAIL() << "the receive returned";
  } catch (const elastic::GenerationEnded& e) {
    EXPECT_EQ(e.successor(), 3);
    EXPECT_NE(std::string(e.what()).find("recv"), std::string::npos) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);  // the group's timeout is 10 s
  failure.get();
}
