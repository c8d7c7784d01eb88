// A generation's communicator (elastic/abortable.h): once a failure generation is published, every wait on it
// ends with GenerationEnded, point to point included, which Gloo can only report from inside its own wait. And a
// restarted rank's membership learns of that failure at once.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
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

// Threads that wait on the same communicator at once do not queue behind each other: a parameter server's
// threads each wait for their own worker's next request while the rank's own worker waits for its replies. Here
// one thread waits for a message that rank 1 sends only once a second thread's message has arrived; with one
// waiter thread per communicator the second wait sat behind the first until the group's timeout.
TEST(Abortable, WaitsOfSeveralThreadsDoNotQueueBehindEachOther) {
  TwoRanks g;
  at::Tensor first = at::zeros({4}), second = at::zeros({4});
  auto waits_first = std::async(std::launch::async, [&] { g.rank0->recv(first, 1, 1)->wait(); });
  std::this_thread::sleep_for(milliseconds(100));  // the first wait is in progress
  const auto start = Clock::now();
  auto waits_second = std::async(std::launch::async, [&] { g.rank0->recv(second, 1, 2)->wait(); });
  at::Tensor two = at::full({4}, 2.0f), one = at::full({4}, 1.0f);
  g.rank1->send(two, 0, 2)->wait();
  const bool second_done = waits_second.wait_for(std::chrono::seconds(3)) == std::future_status::ready;
  const double second_s = seconds_since(start);
  g.rank1->send(one, 0, 1)->wait();  // now the first one too (also ends a stuck second wait)
  waits_first.get();
  waits_second.get();
  EXPECT_TRUE(second_done) << "the second wait took " << second_s << " s";
  EXPECT_LT(second_s, 2.0);
  EXPECT_TRUE(second.equal(two));
  EXPECT_TRUE(first.equal(one));
}

// A restarted process reads no generation record published before it registered: none of them can count it.
// Reading them all (one round trip each) made a restarted rank on a loaded machine see a failure that ended its
// generation seconds late. Here the old records are unreadable: a process that read them would fail or never
// notice the new failure generation.
TEST(Membership, ARestartedProcessStartsAfterTheGenerationsPublishedBeforeIt) {
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 2, milliseconds(10000), -1);
  auto& store = *host->store();
  const auto bytes = [](const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); };
  for (int id = 1; id <= 40; ++id) store.set(elastic::generation_key(id), bytes("not a generation record"));
  store.set(elastic::latest_generation_key(), bytes("40"));
  LaunchEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.master_port = host->port();
  elastic::MembershipOptions options;
  options.comm.timeout_s = 10;
  elastic::Membership m(env, options);
  // The coordinator's next generation counts it: the first it looks at.
  const auto record = [&](int64_t id, const std::string& reason) {
    elastic::Generation g;
    g.id = id;
    g.replicas = {0};
    g.ranks = {1};
    g.incarnations[1] = m.incarnation();
    g.reason = reason;
    store.set(elastic::generation_key(id), bytes(elastic::encode_generation(g)));
    store.set(elastic::latest_generation_key(), bytes(std::to_string(id)));
  };
  record(41, "join");
  const auto start = Clock::now();
  EXPECT_EQ(m.await_member_generation(0).id, 41);
  EXPECT_LT(seconds_since(start), 2.0);
  // A failure that ends it is seen at once.
  record(42, "failure");
  const auto published = Clock::now();
  while (!m.abort_requested(41) && seconds_since(published) < 5) std::this_thread::sleep_for(milliseconds(5));
  EXPECT_TRUE(m.abort_requested(41));
  EXPECT_LT(seconds_since(published), 1.0);
}
