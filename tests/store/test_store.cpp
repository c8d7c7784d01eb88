// The rendezvous store in one process: c10d semantics over TCP, and a server that hostile or broken clients
// cannot freeze, inflate or impersonate a rank on.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>
#include <netdb.h>
#include <system_error>

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "crosstrain/comm/backends/group_formation_store.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/store/abandonable_store.h"
#include "crosstrain/store/address.h"
#include "crosstrain/store/client.h"
#include "crosstrain/store/local_store.h"
#include "crosstrain/store/auth.h"
#include "crosstrain/store/server.h"
#include "crosstrain/core/error.h"
#include "store_probes.h"

using namespace crosstrain;
using namespace crosstrain::comm::store;
using namespace crosstrain::testing;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

ServerOptions quick_server(int world_size) {
  ServerOptions o;
  o.world_size = world_size;
  o.handshake_timeout = milliseconds(500);
  o.stall_timeout = milliseconds(500);
  return o;
}

c10::intrusive_ptr<StoreClient> client(const StoreServer& server, int rank, int world_size,
                                       milliseconds timeout = milliseconds(5000)) {
  Hello h;
  h.rank = rank;
  h.world_size = world_size;
  return c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), h, timeout);
}

// The CommError message a connection attempt fails with, and how long it took.
std::pair<std::string, double> refusal(const std::string& host, int port, int rank, int world_size,
                                       milliseconds timeout) {
  const auto start = Clock::now();
  std::string message = "(no error)";
  try {
    Hello h;
    h.rank = rank;
    h.world_size = world_size;
    StoreClient c(host, port, h, timeout);
  } catch (const CommError& e) {
    message = e.what();
  }
  return {message, std::chrono::duration<double>(Clock::now() - start).count()};
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

}  // namespace

TEST(StoreClient, HasC10dSemantics) {
  StoreServer server(quick_server(2));
  auto a = client(server, 0, 2);
  auto b = client(server, 1, 2);
  a->set("k", bytes("v"));
  EXPECT_EQ(b->get("k"), bytes("v"));
  EXPECT_EQ(a->add("n", 2), 2);
  EXPECT_EQ(b->add("n", 5), 7);
  EXPECT_EQ(a->get("n"), bytes("7"));
  // compareSet: absent + empty expected sets; a mismatch returns the current value.
  EXPECT_EQ(a->compareSet("c", {}, bytes("x")), bytes("x"));
  EXPECT_EQ(a->compareSet("c", bytes("y"), bytes("z")), bytes("x"));
  EXPECT_EQ(a->compareSet("c", bytes("x"), bytes("z")), bytes("z"));
  EXPECT_EQ(a->compareSet("absent", bytes("e"), bytes("z")), bytes("e"));
  EXPECT_TRUE(a->check({"k", "n"}));
  EXPECT_FALSE(a->check({"k", "nope"}));
  EXPECT_EQ(a->getNumKeys(), 3);
  EXPECT_TRUE(a->deleteKey("k"));
  EXPECT_FALSE(a->deleteKey("k"));
  // A wait returns once another client sets the key.
  auto waiter = std::async(std::launch::async, [&] { b->wait({"late"}, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(100));
  a->set("late", bytes("1"));
  waiter.get();
}

TEST(StoreClient, WaitsEndAtTheirTimeoutNamingKeyAndAddress) {
  StoreServer server(quick_server(1));
  auto c = client(server, 0, 1, milliseconds(700));
  auto start = Clock::now();
  try {
    c->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out());
    EXPECT_TRUE(contains(e.what(), "'never'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(server.port()))) << e.what();
    EXPECT_TRUE(contains(e.what(), "[rank 0]")) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);
  auto c2 = client(server, -1, 1, milliseconds(700));
  start = Clock::now();
  EXPECT_THROW(c2->wait({"never"}, milliseconds(300)), CommError);
  EXPECT_LT(seconds_since(start), 2.0);
}

TEST(StoreClient, OversizedValuesAreRejectedAndTheConnectionStaysUsable) {
  StoreServer server(quick_server(1));
  auto c = client(server, 0, 1);
  EXPECT_THROW(c->set(std::string(kMaxKeyBytes + 1, 'k'), bytes("v")), CommError);
  c->set("k", bytes("still fine"));
  EXPECT_EQ(c->get("k"), bytes("still fine"));
}

// GetMany: every key's value in one request, once all are set; a timeout when one never is; a reply too large to
// carry is refused and the connection stays usable.
TEST(StoreClient, GetManyReadsEveryKeyOnceAllAreSet) {
  StoreServer server(quick_server(2));
  auto a = client(server, 0, 2);
  auto b = client(server, 1, 2);
  a->set("x/0", bytes("zero"));
  auto reader = std::async(std::launch::async, [&] { return b->get_many({"x/2", "x/0"}, milliseconds(5000)); });
  std::this_thread::sleep_for(milliseconds(150));
  a->set("x/2", bytes("two"));
  const auto values = reader.get();
  ASSERT_EQ(values.size(), 2u);
  EXPECT_EQ(values[0], bytes("two"));
  EXPECT_EQ(values[1], bytes("zero"));
  const auto start = Clock::now();
  try {
    b->get_many({"x/0", "never"}, milliseconds(300));
    FAIL() << "get_many with a missing key returned";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out()) << e.what();
    EXPECT_TRUE(contains(e.what(), "'never'")) << e.what();
  }
  EXPECT_LT(seconds_since(start), 2.0);
  const std::vector<uint8_t> big(kMaxValueBytes / 2 + 1, 'v');
  a->set("big/0", big);
  a->set("big/1", big);
  try {
    a->get_many({"big/0", "big/1"}, milliseconds(1000));
    FAIL() << "a reply over the limit was sent";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "read them with get")) << e.what();
  }
  EXPECT_EQ(a->get("x/2"), bytes("two"));  // still usable
}

namespace {

// A store that counts how it is asked.
class CountingStore : public LocalStore {
 public:
  using LocalStore::LocalStore;
  std::vector<uint8_t> get(const std::string& key) override {
    ++gets;
    return LocalStore::get(key);
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    ++waits;
    LocalStore::wait(keys, timeout);
  }
  std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys, milliseconds wait) override {
    ++many;
    return LocalStore::get_many(keys, wait);
  }
  std::atomic<int> gets{0}, waits{0}, many{0};
};

}  // namespace

// A Gloo group of four forms over GroupFormationStore: each member reads the other members' addresses in one
// request, and the host names of the members below it in another (each a round trip across a wide-area link),
// instead of a wait and a read per member, and the group works.
TEST(GroupFormationStore, AGlooGroupReadsEveryMembersAddressInOneRequest) {
  const int n = 4;
  auto table = std::make_shared<StoreTable>();
  std::vector<c10::intrusive_ptr<CountingStore>> bases;
  for (int r = 0; r < n; ++r) bases.push_back(c10::make_intrusive<CountingStore>(table, "here", r, milliseconds(10000)));
  std::vector<std::future<double>> ranks;
  for (int r = 0; r < n; ++r)
    ranks.push_back(std::async(std::launch::async, [&, r] {
      auto store = c10::make_intrusive<comm::GroupFormationStore>(bases[r], "job/g1/", r, n, nullptr, "g1");
      auto options = c10d::ProcessGroupGloo::Options::create(milliseconds(10000));
      options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      c10d::ProcessGroupGloo group(store, r, n, options);
      std::vector<at::Tensor> t = {at::full({3}, static_cast<double>(r + 1))};
      group.allreduce(t)->wait();
      EXPECT_EQ(store->batched_reads(), r == 0 ? 1 : 2) << "rank " << r;
      return t[0][0].item<double>();
    }));
  for (auto& f : ranks) EXPECT_EQ(f.get(), 1.0 + 2 + 3 + 4);
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(bases[r]->many.load(), r == 0 ? 1 : 2) << "rank " << r;
    EXPECT_EQ(bases[r]->gets.load() + bases[r]->waits.load(), 0) << "rank " << r << ": one read per member";
  }
  EXPECT_TRUE(table->contains_all({"job/g1/0/0", "job/g1/0/3"}));  // the keys live under the group's prefix
}

// A member that never comes: a formation given up ends within a slice, naming the group; other keys pass through.
TEST(GroupFormationStore, AFormationGivenUpEndsAtOnceAndOtherKeysPassThrough) {
  auto table = std::make_shared<StoreTable>();
  auto base = c10::make_intrusive<CountingStore>(table, "here", 0, milliseconds(10000));
  const auto start = Clock::now();
  comm::GroupFormationStore store(base, "job/g2/", 0, 2, [start] { return seconds_since(start) > 0.3; }, "g2");
  store.set("not/a/member", bytes("v"));
  EXPECT_EQ(store.get("not/a/member"), bytes("v"));
  EXPECT_EQ(base->many.load(), 0);
  try {
    store.wait({"0/1"});
    FAIL() << "the wait for a member that never came returned";
  } catch (const CommError& e) {
    EXPECT_TRUE(contains(e.what(), "group 'g2' was given up before it formed")) << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.5);  // 10 s without the predicate
}

TEST(StoreServer, ListensOnlyOnTheAddressGiven) {
  StoreServer server(quick_server(1));
  EXPECT_EQ(server.bound_address(), "127.0.0.1:" + std::to_string(server.port()));
  int local = raw_connect("127.0.0.1", server.port());
  EXPECT_GE(local, 0);
  close(local);
  // 127.0.0.2 is this machine too (all of 127/8 is loopback), but not the address the store was given.
  int other = raw_connect("127.0.0.2", server.port());
  EXPECT_LT(other, 0) << "the store answered on 127.0.0.2";
  if (other >= 0) close(other);
}

TEST(StoreServer, SurvivesHostileClientsAndKeepsServing) {
  StoreServer server(quick_server(2));
  const double rss_before = peak_rss_mib();
  int gib = raw_connect("127.0.0.1", server.port());
  raw_send(gib, gigabyte_prefix());
  int noise = raw_connect("127.0.0.1", server.port());
  raw_send(noise, garbage(4096));
  int stalled = raw_connect("127.0.0.1", server.port());
  raw_send(stalled, {'C', 'T', 'R'});  // part of a preamble, then silence
  int silent = raw_connect("127.0.0.1", server.port());
  auto member = client(server, 0, 2);
  // The honest ranks are served while all of that is connected.
  auto start = Clock::now();
  auto other = client(server, 1, 2);
  member->set("addr0", bytes("a"));
  EXPECT_EQ(other->get("addr0"), bytes("a"));
  EXPECT_LT(seconds_since(start), 2.0);  // not held up by the 5 s handshake limit
  for (int fd : {gib, noise}) EXPECT_TRUE(closed_by_peer(fd, milliseconds(2000)));  // at once; room for load
  for (int fd : {stalled, silent}) EXPECT_TRUE(closed_by_peer(fd, milliseconds(2000)));  // handshake 0.5 s
  EXPECT_LT(peak_rss_mib() - rss_before, 64.0) << "the server allocated for a stranger's length prefix";
  for (int fd : {gib, noise, stalled, silent}) close(fd);
  // A member that stalls mid-message is dropped; the others go on.
  int half = raw_connect("127.0.0.1", server.port());
  auto hello = encode_preamble();
  auto frame = encode_frame(encode_hello(Hello{-1, 2, {}}));
  hello.insert(hello.end(), frame.begin(), frame.end());
  auto set = encode_frame(Message{Code::Set, {"k", std::string(1000, 'v')}});
  hello.insert(hello.end(), set.begin(), set.begin() + 100);
  raw_send(half, hello);
  EXPECT_TRUE(closed_by_peer(half, milliseconds(2000)));
  close(half);
  // An admitted client that announces a 1 GiB message is dropped as soon as the length is read.
  int big = raw_connect("127.0.0.1", server.port());
  auto greet = encode_preamble();
  greet.insert(greet.end(), frame.begin(), frame.end());
  for (uint8_t b : {0x00, 0x00, 0x00, 0x40}) greet.push_back(b);
  raw_send(big, greet);
  EXPECT_TRUE(closed_by_peer(big, milliseconds(2000)));
  close(big);
  EXPECT_EQ(other->add("alive", 1), 1);
}

// Issue 34: strangers that connect and say nothing (or reconnect to do it again) cannot hold the slots ranks need:
// at the limit a newcomer displaces the oldest connection still in its handshake.
TEST(StoreServer, SquattersInTheirHandshakeAreDisplacedByARankAtTheConnectionLimit) {
  ServerOptions options = quick_server(2);
  options.max_connections = 4;
  options.handshake_timeout = milliseconds(20000);  // they would hold their slots for 20 s
  StoreServer server(options);
  std::vector<int> squatters;
  for (int i = 0; i < 4; ++i) squatters.push_back(raw_connect("127.0.0.1", server.port()));
  std::this_thread::sleep_for(milliseconds(100));
  auto start = Clock::now();
  auto rank = client(server, 0, 2, milliseconds(5000));
  EXPECT_LT(seconds_since(start), 1.0) << "the rank waited for a squatter's handshake limit";
  rank->set("k", bytes("v"));
  // Squatters keep coming back; every one displaces another squatter, never the admitted rank.
  for (int round = 0; round < 20; ++round) squatters.push_back(raw_connect("127.0.0.1", server.port()));
  std::this_thread::sleep_for(milliseconds(200));
  auto second = client(server, 1, 2, milliseconds(5000));
  EXPECT_EQ(second->get("k"), bytes("v"));
  EXPECT_EQ(rank->get("k"), bytes("v"));
  for (int s : squatters) close(s);
}

TEST(StoreServer, RefusesStrangersAtOnceNamingWhatMismatched) {
  StoreServer server(quick_server(2));
  auto zero = client(server, 0, 2);
  const std::string at = "127.0.0.1:" + std::to_string(server.port());
  auto [other_job, t1] = refusal("127.0.0.1", server.port(), 1, 4, milliseconds(10000));
  EXPECT_TRUE(contains(other_job, "[rank 1]")) << other_job;
  EXPECT_TRUE(contains(other_job, at)) << other_job;
  EXPECT_TRUE(contains(other_job, "job of 2 ranks")) << other_job;
  EXPECT_TRUE(contains(other_job, "WORLD_SIZE=4")) << other_job;
  auto [taken, t2] = refusal("127.0.0.1", server.port(), 0, 2, milliseconds(10000));
  EXPECT_TRUE(contains(taken, "rank 0 is already connected")) << taken;
  auto [outside, t3] = refusal("127.0.0.1", server.port(), 7, 2, milliseconds(10000));
  EXPECT_TRUE(contains(outside, "outside 0..1")) << outside;
  for (double t : {t1, t2, t3}) EXPECT_LT(t, 3.0);  // at once, not at the 10 s timeout
  // The rank is free again once its holder disconnects.
  zero.reset();
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_NO_THROW(client(server, 0, 2));
}

TEST(StoreClient, GivesUpWithinItsTimeoutOnAServerThatNeverAnswers) {
  // A listener that accepts and then says nothing (some other program on the port).
  int port = 0;
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  port = ntohs(addr.sin_port);
  auto [message, seconds] = refusal("127.0.0.1", port, 1, 2, milliseconds(1000));
  EXPECT_TRUE(contains(message, "handshake")) << message;
  EXPECT_TRUE(contains(message, "127.0.0.1:" + std::to_string(port))) << message;
  EXPECT_GE(seconds, 0.9);
  EXPECT_LT(seconds, 2.0);
  close(listener);
  // Nothing listening at all: retried until the timeout, then named.
  auto [unreachable, t] = refusal("127.0.0.1", port, 1, 2, milliseconds(800));
  EXPECT_TRUE(contains(unreachable, "cannot reach")) << unreachable;
  EXPECT_LT(t, 2.0);
}

TEST(StoreServer, ShutsDownPromptlyWithClientsStillConnected) {
  auto server = std::make_unique<StoreServer>(quick_server(2));
  auto member = client(*server, 0, 2);
  int stalled = raw_connect("127.0.0.1", server->port());
  raw_send(stalled, {'C'});
  auto waiter = std::async(std::launch::async, [&] {
    try {
      member->wait({"never"}, milliseconds(30000));
    } catch (const CommError&) {
    }
  });
  std::this_thread::sleep_for(milliseconds(100));
  auto start = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(waiter.wait_for(std::chrono::seconds(2)), std::future_status::ready);
  close(stalled);
}

TEST(Rendezvous, GlooGroupsFormOnTheStoreWhileStrangersPester) {
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 2, milliseconds(10000), 0);
  const int port = host->port();
  int gib = raw_connect("127.0.0.1", port);
  raw_send(gib, gigabyte_prefix());
  int stalled = raw_connect("127.0.0.1", port);
  raw_send(stalled, {'C', 'T'});
  auto rank1 = std::async(std::launch::async, [&] {
    auto r = comm::Rendezvous::connect("127.0.0.1", port, 1, 2, milliseconds(10000));
    auto world = comm::make_gloo_communicator(r, 1, 2, milliseconds(10000), "world");
    at::Tensor t = at::ones({4});
    world->all_reduce(t, comm::ReduceOp::Sum)->wait();
    return t[0].item<double>();
  });
  auto world = comm::make_gloo_communicator(host, 0, 2, milliseconds(10000), "world");
  at::Tensor t = at::ones({4});
  world->all_reduce(t, comm::ReduceOp::Sum)->wait();
  EXPECT_EQ(t[0].item<double>(), 2.0);
  EXPECT_EQ(rank1.get(), 2.0);
  close(gib);
  close(stalled);
}

TEST(AbandonableStore, AWaitEndsSoonAfterItIsAbandonedAndOtherwiseBehavesAsTheStore) {
  StoreServer server(quick_server(2));
  auto inner = client(server, 0, 2, milliseconds(5000));
  std::atomic<bool> abandoned{false};
  AbandonableStore store(inner, [&] { return abandoned.load(); }, "the generation ended");
  // Passes through: a key set later is waited for across slices and read.
  auto writer = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(milliseconds(350));
    client(server, 1, 2)->set("later", bytes("v"));
  });
  EXPECT_EQ(store.get("later"), bytes("v"));
  writer.get();
  // A real timeout is still the inner store's, and still reads as one.
  try {
    store.wait({"never"}, milliseconds(250));
    FAIL() << "a wait for a missing key returned";
  } catch (const CommError& e) {
    EXPECT_TRUE(e.timed_out()) << e.what();
  }
  // Abandoned: the wait (of 5 s) ends within about a slice, naming the key and why.
  auto giver = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(milliseconds(300));
    abandoned = true;
  });
  const auto start = Clock::now();
  try {
    store.get("never");
    FAIL() << "get of a missing key returned";
  } catch (const CommError& e) {
    EXPECT_FALSE(e.timed_out()) << e.what();
    EXPECT_TRUE(contains(e.what(), "'never'")) << e.what();
    EXPECT_TRUE(contains(e.what(), "the generation ended")) << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.5);
  giver.get();
}

TEST(Rendezvous, AGroupGivenUpWhileItFormsEndsAtOnceNotAfterItsTimeout) {
  // Rank 1 never comes (it went to a later elastic generation): rank 0 gives the group up after 0.3 s.
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 2, milliseconds(10000), 0);
  const auto start = Clock::now();
  std::string message;
  try {
    // By value: the group forms on a helper thread that may still ask after this test has returned.
    comm::make_gloo_communicator(host, 0, 2, milliseconds(10000), "g7",
                                 [start] { return seconds_since(start) > 0.3; });
  } catch (const CommError& e) {
    message = e.what();
  }
  EXPECT_TRUE(contains(message, "given up before it formed")) << message;
  EXPECT_TRUE(contains(message, "g7")) << message;
  EXPECT_LT(seconds_since(start), 3.0);  // 10 s without the predicate
}

TEST(StoreServer, TurnsAwayAConnectionItCannotStartAThreadForAndLogsItOnce) {
  // std::thread throws when the process or pids limit is reached; escaping the accept loop, that terminated
  // the launcher and every rank with it.
  std::atomic<int> calls{0};
  ServerOptions options = quick_server(1);
  options.start_thread = [&](std::function<void()> body) {
    const int call = calls++;
    if (call == 1 || call == 2) throw std::system_error(EAGAIN, std::generic_category(), "thread creation");
    return std::thread(std::move(body));
  };
  ::testing::internal::CaptureStderr();
  {
    StoreServer server(options);  // call 0: the accept loop
    for (int i = 0; i < 2; ++i) {
      int turned_away = raw_connect("127.0.0.1", server.port());
      EXPECT_TRUE(closed_by_peer(turned_away, milliseconds(2000)));
      close(turned_away);
    }
    auto rank = client(server, 0, 1);  // the next connection gets its thread
    rank->set("k", bytes("v"));
    EXPECT_EQ(rank->get("k"), bytes("v"));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "cannot start a thread")) << log;
  EXPECT_TRUE(contains(log, "ulimit -u")) << log;
  EXPECT_EQ(log.find("cannot start a thread"), log.rfind("cannot start a thread")) << "logged more than once:\n" << log;
}

TEST(StoreServer, AConstructorThatCannotStartItsThreadLeavesNothingOpen) {
  const size_t before = open_descriptors();
  ServerOptions options = quick_server(1);
  options.start_thread = [](std::function<void()>) -> std::thread {
    throw std::system_error(EAGAIN, std::generic_category(), "thread creation");
  };
  EXPECT_THROW(StoreServer server(options), std::system_error);
  EXPECT_EQ(open_descriptors(), before) << "the listening socket or the wake pipe leaked";
}

TEST(StoreServer, AnnouncedMessagesCostNothingAndArrivingOnesStayWithinTheBudget) {
  ServerOptions options = quick_server(8);
  options.stall_timeout = milliseconds(2000);
  options.message_timeout = milliseconds(4000);
  options.max_in_flight_bytes = size_t{16} << 20;
  StoreServer server(options);
  const std::vector<uint8_t> payload(size_t{4} << 20, 'x');  // touched before the baseline
  const double before = peak_rss_mib();
  // Eight ranks announce the largest message and eight probes theirs; the buffer used to be zero-filled to the
  // announced size at once (8 x 132 MiB here), before a single byte of it arrived.
  std::vector<int> ranks, probes;
  for (int r = 0; r < 8; ++r) ranks.push_back(raw_member(server.port(), r, 8));
  for (int i = 0; i < 8; ++i) probes.push_back(raw_member(server.port(), -1, 8));
  for (int fd : ranks) ASSERT_GE(fd, 0);
  for (int fd : probes) ASSERT_GE(fd, 0);
  EXPECT_LT(raw_member(server.port(), -1, 8), 0) << "a ninth probe was admitted";
  for (int fd : ranks) raw_send(fd, le32(static_cast<uint32_t>(kMaxFrameBytes)));
  for (int fd : probes) raw_send(fd, le32(static_cast<uint32_t>(kMaxProbeFrameBytes)));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_LT(peak_rss_mib() - before, 16.0) << "announcing a message allocated it";
  // Now the ranks send 4 MiB each, 32 MiB in all: the server holds at most its 16 MiB budget of them.
  std::vector<std::thread> senders;
  for (int fd : ranks) senders.emplace_back([&payload, fd] { raw_send(fd, payload); });
  size_t most = 0;
  for (int i = 0; i < 20; ++i) {
    most = std::max(most, server.bytes_in_flight());
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_GT(most, 0u);
  EXPECT_LE(most, options.max_in_flight_bytes);
  EXPECT_LT(peak_rss_mib() - before, 64.0) << "the server held more than its budget (and buffer slack)";
  // Unfinished messages end at their deadline; the memory and the slots come back.
  for (int fd : probes) EXPECT_TRUE(closed_by_peer(fd, milliseconds(8000)));
  for (int fd : ranks) EXPECT_TRUE(closed_by_peer(fd, milliseconds(8000)));
  for (int fd : ranks) shutdown(fd, SHUT_RDWR);  // ends a send still blocked
  for (auto& t : senders) t.join();
  for (int fd : ranks) close(fd);
  for (int fd : probes) close(fd);
  EXPECT_EQ(server.bytes_in_flight(), 0u);
  // Rank 0 comes back once the server has reaped its dropped connection (a moment on a loaded machine).
  c10::intrusive_ptr<StoreClient> again;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!again) {
    try {
      again = client(server, 0, 8);
    } catch (const crosstrain::CommError& e) {
      if (std::chrono::steady_clock::now() > give_up || !contains(e.what(), "already connected")) throw;
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  EXPECT_EQ(again->add("alive", 1), 1);
}

TEST(StoreServer, DropsAMessageThatTricklesInPastItsDeadline) {
  ServerOptions options = quick_server(1);
  options.stall_timeout = milliseconds(1000);
  options.message_timeout = milliseconds(1500);
  StoreServer server(options);
  int fd = raw_member(server.port(), -1, 1);
  ASSERT_GE(fd, 0);
  // One byte every 200 ms never trips the 1 s stall limit; only the whole-message deadline ends it.
  const auto set = encode_frame(Message{Code::Set, {"k", std::string(1000, 'v')}});
  std::atomic<bool> stop{false};
  std::thread trickler([&] {
    for (size_t i = 0; i < set.size() && !stop; ++i) {
      if (send(fd, &set[i], 1, MSG_NOSIGNAL) < 0) return;
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  const auto start = Clock::now();
  EXPECT_TRUE(closed_by_peer(fd, milliseconds(8000))) << "a trickling client kept its message open";
  EXPECT_GT(seconds_since(start), 1.0);
  EXPECT_LT(seconds_since(start), 5.0);
  stop = true;
  trickler.join();
  close(fd);
}

TEST(StoreServer, AWaitLastsAtMostTheJobTimeout) {
  ServerOptions options = quick_server(1);
  options.max_wait = milliseconds(700);
  StoreServer server(options);
  auto rank = client(server, 0, 1, milliseconds(20000));
  const auto start = Clock::now();
  EXPECT_THROW(rank->wait({"never"}, milliseconds(20000)), CommError);
  EXPECT_THROW(rank->get("never"), CommError);
  EXPECT_LT(seconds_since(start), 5.0) << "the server waited as long as the client asked";
}

TEST(StoreServer, AWaitingClientThatHangsUpFreesItsThreadAndSlot) {
  StoreServer server(quick_server(1));  // the default max_wait: minutes
  int fd = raw_member(server.port(), -1, 1);
  ASSERT_GE(fd, 0);
  raw_send(fd, encode_frame(Message{Code::Wait, {std::to_string(24 * 3600 * 1000), "never"}}));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(server.connections(), 1u);
  close(fd);
  const auto start = Clock::now();
  while (server.connections() > 0 && seconds_since(start) < 5.0) std::this_thread::sleep_for(milliseconds(50));
  EXPECT_EQ(server.connections(), 0u) << "a day-long wait outlived its client";
  EXPECT_LT(seconds_since(start), 3.0);
}

TEST(StoreServer, AMachineNameThatResolvesOnlyToLoopbackListensOnEveryInterface) {
  // Debian maps the machine's own name to 127.0.1.1; under srun that name is MASTER_ADDR, and listening on
  // loopback alone left every other node unable to reach the store.
  char name[256] = {};
  ASSERT_EQ(gethostname(name, sizeof name - 1), 0);
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* list = nullptr;
  if (getaddrinfo(name, nullptr, &hints, &list) != 0) GTEST_SKIP() << "'" << name << "' does not resolve";
  bool only_loopback = true;
  for (addrinfo* a = list; a; a = a->ai_next) {
    char host[NI_MAXHOST];
    getnameinfo(a->ai_addr, a->ai_addrlen, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
    only_loopback = only_loopback && is_loopback_address(host);
  }
  freeaddrinfo(list);
  if (!only_loopback) GTEST_SKIP() << "'" << name << "' resolves to a network address here";
  ServerOptions options = quick_server(1);
  options.host = name;
  ::testing::internal::CaptureStderr();
  StoreServer server(options);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "resolves only to loopback")) << log;
  EXPECT_TRUE(contains(server.bound_address(), "0.0.0.0:")) << server.bound_address();
  int other = raw_connect("127.0.0.2", server.port());  // stands in for another node's address
  EXPECT_GE(other, 0) << "the store listened on loopback only";
  if (other >= 0) close(other);
}

namespace {

ServerOptions secret_server(int world_size, const std::string& job, const std::string& secret) {
  ServerOptions o = quick_server(world_size);
  o.job = comm::JobCredentials{job, secret};
  return o;
}

// The CommError message a client of `job` holding `secret` gets from the store ("(no error)" when admitted).
std::string join_error(const StoreServer& server, int rank, int world_size, const std::string& job,
                       const std::string& secret) {
  try {
    Hello h;
    h.rank = rank;
    h.world_size = world_size;
    h.job = job;
    StoreClient c("127.0.0.1", server.port(), h, milliseconds(5000), secret);
  } catch (const CommError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(StoreAuth, TheRightSecretIsAdmittedAndStrangersAreRefusedWhileTheJobGoesOn) {
  ::testing::internal::CaptureStderr();
  StoreServer server(secret_server(3, "job-a", "s3cret"));
  const std::string at = "127.0.0.1:" + std::to_string(server.port());
  Hello h;
  h.rank = 0;
  h.world_size = 3;
  h.job = "job-a";
  auto member = c10::make_intrusive<StoreClient>("127.0.0.1", server.port(), h, milliseconds(5000), "s3cret");
  member->set("k", bytes("v"));

  const std::string wrong = join_error(server, 1, 3, "job-a", "guess");
  EXPECT_TRUE(contains(wrong, at)) << wrong;
  EXPECT_TRUE(contains(wrong, "refused this process: wrong job secret; set CROSSTRAIN_SECRET")) << wrong;
  EXPECT_FALSE(contains(wrong, "s3cret")) << wrong;
  const std::string none = join_error(server, 1, 3, "job-a", "");
  EXPECT_TRUE(contains(none, "this process has none; set CROSSTRAIN_SECRET")) << none;
  const std::string other_job = join_error(server, 1, 3, "job-b", "s3cret");
  EXPECT_TRUE(contains(other_job, "job id 'job-a'")) << other_job;
  EXPECT_TRUE(contains(other_job, "job id 'job-b'")) << other_job;
  const std::string probe = join_error(server, -1, 3, "job-a", "guess");  // tools prove it too
  EXPECT_TRUE(contains(probe, "wrong job secret")) << probe;

  // The admitted client is still served, and a refused rank's slot was never taken.
  EXPECT_EQ(member->get("k"), bytes("v"));
  EXPECT_EQ(join_error(server, 1, 3, "job-a", "s3cret"), "(no error)");
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "crosstrain: refused a store connection from 127.0.0.1:")) << log;
  EXPECT_TRUE(contains(log, ": it did not prove the job secret\n")) << log;
  EXPECT_TRUE(contains(log, ": it has no job secret\n")) << log;
  EXPECT_TRUE(contains(log, ": it belongs to another job (job id 'job-b')\n")) << log;
  EXPECT_FALSE(contains(log, "s3cret")) << log;
}

namespace {

// Reads one frame of a blocking socket (test helper: no limits, no deadline beyond the socket's).
Message read_frame(int fd) {
  uint8_t prefix[kLengthBytes];
  EXPECT_EQ(recv(fd, prefix, sizeof prefix, MSG_WAITALL), static_cast<ssize_t>(sizeof prefix));
  const uint32_t size = parse_length(prefix, kMaxFrameBytes);
  std::vector<uint8_t> body(size);
  EXPECT_EQ(recv(fd, body.data(), size, MSG_WAITALL), static_cast<ssize_t>(size));
  return decode_body(body.data(), size);
}

// A store that admits anyone and claims a proof it cannot have made: what a process posing as the job's store at
// MASTER_ADDR would do.
void serve_one_impostor(int listener) {
  int fd = accept(listener, nullptr, nullptr);
  uint8_t preamble[kPreambleBytes];
  recv(fd, preamble, sizeof preamble, MSG_WAITALL);
  read_frame(fd);  // hello
  raw_send(fd, encode_frame(Message{Code::Challenge, {random_nonce()}}));
  read_frame(fd);  // the client's proof
  raw_send(fd, encode_frame(Message{Code::Ok, {"world_size", "2", "version", "2", "proof", random_nonce()}}));
  std::this_thread::sleep_for(milliseconds(200));
  close(fd);
}

}  // namespace

TEST(StoreAuth, AClientWithASecretRefusesAStoreThatCannotProveIt) {
  StoreServer open_store(secret_server(2, "job-a", ""));
  const std::string unproven = join_error(open_store, 1, 2, "job-a", "s3cret");
  EXPECT_TRUE(contains(unproven, "runs without a job secret, but this process has one")) << unproven;

  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  auto impostor = std::async(std::launch::async, [&] { serve_one_impostor(listener); });
  std::string message = "(admitted)";
  try {
    Hello h;
    h.rank = 1;
    h.world_size = 2;
    h.job = "job-a";
    StoreClient c("127.0.0.1", port, h, milliseconds(5000), "s3cret");
  } catch (const CommError& e) {
    message = e.what();
  }
  impostor.get();
  close(listener);
  EXPECT_TRUE(contains(message, "did not prove the job secret")) << message;
  EXPECT_TRUE(contains(message, "127.0.0.1:" + std::to_string(port))) << message;
}

TEST(StoreAuth, AFloodOfWrongSecretsLogsAFewLinesOnly) {
  ::testing::internal::CaptureStderr();
  {
    StoreServer server(secret_server(2, "job-a", "s3cret"));
    for (int i = 0; i < 30; ++i) join_error(server, 1, 2, "job-a", "guess");
    EXPECT_EQ(join_error(server, 1, 2, "job-a", "s3cret"), "(no error)");
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t lines = 0;
  for (size_t at = log.find("refused a store connection"); at != std::string::npos;
       at = log.find("refused a store connection", at + 1))
    ++lines;
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 5u) << log;
}

TEST(Rendezvous, KeysLiveUnderTheJobsPrefixAndGlooFormsWithASecret) {
  const comm::JobCredentials job{"job-a", "s3cret"};
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 2, milliseconds(10000), 0, job);
  EXPECT_FALSE(host->listens_beyond_loopback());
  auto rank1 = std::async(std::launch::async, [&] {
    auto r = comm::Rendezvous::connect("127.0.0.1", host->port(), 1, 2, milliseconds(10000), job);
    r->store()->set("mine", bytes("1"));
    auto world = comm::make_gloo_communicator(r, 1, 2, milliseconds(10000), "world");
    at::Tensor t = at::ones({4});
    world->all_reduce(t, comm::ReduceOp::Sum)->wait();
    return t[0].item<double>();
  });
  auto world = comm::make_gloo_communicator(host, 0, 2, milliseconds(10000), "world");
  at::Tensor t = at::ones({4});
  world->all_reduce(t, comm::ReduceOp::Sum)->wait();
  EXPECT_EQ(rank1.get(), 2.0);
  // The same job id's prefix, seen from a tool of the job: the key lies under crosstrain/job/job-a/.
  Hello tool;
  tool.world_size = 2;
  tool.job = "job-a";
  StoreClient raw("127.0.0.1", host->port(), tool, milliseconds(5000), "s3cret");
  EXPECT_TRUE(raw.check({"crosstrain/job/job-a/mine"}));
  EXPECT_FALSE(raw.check({"mine"}));
}

namespace {

// A man in the middle between a client and the store: forwards both ways, keeps every byte the client sent, and on
// request changes or replays the client's next message.
class PathAttacker {
 public:
  explicit PathAttacker(int store_port) : store_port_(store_port) {
    listener_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    listen(listener_, 1);
    socklen_t len = sizeof a;
    getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] { relay(); });
  }
  ~PathAttacker() {
    stop_ = true;
    thread_.join();
    close(listener_);
  }
  int port() const { return port_; }
  enum class Next { Pass, FlipAByte, Replay };
  void on_next_request(Next n) { next_ = n; }
  std::string client_bytes() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }

 private:
  void relay() {
    pollfd l{listener_, POLLIN, 0};
    while (!stop_ && poll(&l, 1, 50) == 0) {
    }
    if (stop_) return;
    const int client = accept(listener_, nullptr, nullptr);
    const int store = raw_connect("127.0.0.1", store_port_);
    std::vector<uint8_t> previous;
    char buffer[1 << 16];
    while (!stop_) {
      pollfd fds[2] = {{client, POLLIN, 0}, {store, POLLIN, 0}};
      if (poll(fds, 2, 50) <= 0) continue;
      if (fds[1].revents & (POLLIN | POLLHUP)) {
        const ssize_t n = read(store, buffer, sizeof buffer);
        if (n <= 0) break;
        raw_send(client, std::vector<uint8_t>(buffer, buffer + n));
      }
      if (fds[0].revents & (POLLIN | POLLHUP)) {
        const ssize_t n = read(client, buffer, sizeof buffer);
        if (n <= 0) break;
        std::vector<uint8_t> chunk(buffer, buffer + n);
        {
          std::lock_guard<std::mutex> lock(mu_);
          seen_.append(buffer, n);
        }
        const Next act = next_.exchange(Next::Pass);
        if (act == Next::FlipAByte) chunk[std::min<size_t>(chunk.size() - 1, 9)] ^= 0x20;
        raw_send(store, chunk);
        if (act == Next::Replay) raw_send(store, previous);
        previous.assign(buffer, buffer + n);
      }
    }
    close(client);
    close(store);
  }

  int store_port_, listener_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<Next> next_{Next::Pass};
  std::mutex mu_;
  std::string seen_;
  std::thread thread_;
};

// A client of rank `rank` of job-a (world of 3) holding "s3cret", connected through `port`.
c10::intrusive_ptr<StoreClient> secret_client(int port, int rank) {
  Hello h;
  h.rank = rank;
  h.world_size = 3;
  h.job = "job-a";
  return c10::make_intrusive<StoreClient>("127.0.0.1", port, h, milliseconds(3000), "s3cret");
}

}  // namespace

TEST(StoreAuth, AfterTheHandshakeEveryRequestIsSealedAndAChangedOrReplayedOneIsRefused) {
  ::testing::internal::CaptureStderr();
  StoreServer server(secret_server(3, "job-a", "s3cret"));
  const std::string address = "gloo-address-10.1.2.3:45678";
  for (PathAttacker::Next attack : {PathAttacker::Next::FlipAByte, PathAttacker::Next::Replay}) {
    PathAttacker path(server.port());
    auto c = secret_client(path.port(), attack == PathAttacker::Next::FlipAByte ? 0 : 1);
    c->set("first", bytes(address));
    EXPECT_EQ(c->get("first"), bytes(address));
    // Nothing the client sent after the handshake can be read on the way.
    EXPECT_FALSE(contains(path.client_bytes(), address)) << "the request went in the clear";
    path.on_next_request(attack);
    std::string error;
    try {
      c->set(attack == PathAttacker::Next::FlipAByte ? "flipped" : "replayed", bytes("rewritten"));
      c->get("first");  // a replay is refused after the request it copies was answered
    } catch (const CommError& e) {
      error = e.what();
    }
    EXPECT_NE(error, "") << "the store accepted a changed or replayed request";
  }
  // The server dropped both connections and logged why; the store holds nothing the attacker sent.
  auto honest = secret_client(server.port(), 2);
  EXPECT_FALSE(honest->check({"flipped"})) << "a changed request was applied";
  EXPECT_EQ(honest->get("first"), bytes(address));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "did not authenticate")) << log;
}
