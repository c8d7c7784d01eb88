// comm.encrypt (comm/secure/encryption.h), ranks as threads over the in-process back end: every collective matches
// the reference through sealed messages (world sizes 1-8, sizes 0 to > 1 MiB, every dtype); "wan" seals only the
// groups that cross clusters; nothing on the wire is the plaintext; a changed, replayed, reordered or dropped
// message fails naming the peer, the operation and the step; a peer with another secret is refused at once.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "conformance.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/secure/encryption.h"

#include <sodium.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>

using namespace crosstrain;
using comm::Communicator;
using comm::EncryptMode;
using comm::FakeWorld;
using comm::Millis;
using comm::ReduceOp;
using comm::WorkPtr;

namespace {

// What a man in the middle does to one rank's outgoing messages: sees each (and may replace it) before it leaves.
// What goes on the wire instead (nothing: dropped; several: injected).
using OnSend = std::function<std::vector<at::Tensor>(const at::Tensor& box, int dst, int tag)>;

// Forwards everything to the in-process back end; point-to-point sends pass through `on_send` first (the sealed
// communicator's collectives are all point-to-point, so every byte it moves goes through here).
class Wire : public Communicator {
 public:
  Wire(std::unique_ptr<Communicator> inner, OnSend on_send)
      : Communicator(inner->backend(), inner->name(), inner->rank(), inner->size(), inner->timeout()),
        inner_(std::move(inner)), on_send_(std::move(on_send)) {}
  void set_step(int64_t s) override {
    Communicator::set_step(s);
    inner_->set_step(s);
  }
  WorkPtr broadcast(at::Tensor& t, int root) override { return inner_->broadcast(t, root); }
  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override { return inner_->reduce(t, root, op); }
  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override { return inner_->all_reduce(t, op); }
  WorkPtr gather(const at::Tensor& i, at::Tensor& o, int root) override { return inner_->gather(i, o, root); }
  WorkPtr all_gather(const at::Tensor& i, at::Tensor& o) override { return inner_->all_gather(i, o); }
  WorkPtr scatter(const at::Tensor& i, at::Tensor& o, int root) override { return inner_->scatter(i, o, root); }
  WorkPtr reduce_scatter(const at::Tensor& i, at::Tensor& o, ReduceOp op) override {
    return inner_->reduce_scatter(i, o, op);
  }
  WorkPtr all_to_all(const at::Tensor& i, at::Tensor& o) override { return inner_->all_to_all(i, o); }
  WorkPtr barrier() override { return inner_->barrier(); }
  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    if (!on_send_) return inner_->send(t, dst, tag);
    WorkPtr last = comm::completed_work();
    for (const at::Tensor& m : on_send_(t, dst, tag)) last = inner_->send(m, dst, tag);
    return last;
  }
  WorkPtr recv(at::Tensor& t, int src, int tag) override { return inner_->recv(t, src, tag); }
  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    auto sub = inner_->split(ranks);
    return sub ? std::make_unique<Wire>(std::move(sub), on_send_) : nullptr;
  }

 private:
  std::unique_ptr<Communicator> inner_;
  OnSend on_send_;
};

struct RankSetup {
  EncryptMode mode = EncryptMode::All;
  std::string secret = "a job secret";
  int cluster = -1;
  OnSend on_send;
  comm::DataPlaneSecurity identity;  // its identity fields only
};

// Runs `body` on every rank of a world of n threads, each sealed as setup(rank) says. Returns each rank's error.
std::vector<std::string> on_ranks(int n, const std::function<RankSetup(int)>& setup,
                                  const std::function<void(Communicator&)>& body, Millis timeout = Millis(20000)) {
  FakeWorld world(n, timeout);
  std::vector<std::thread> threads;
  std::vector<std::string> errors(n);
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        const RankSetup s = setup(r);
        comm::DataPlaneSecurity security = s.identity;
        security.mode = s.mode;
        security.secret = s.secret;
        security.cluster = s.cluster;
        auto c = comm::with_encryption(std::make_unique<Wire>(world.communicator(r), s.on_send), security);
        body(*c);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

void expect_no_errors(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

class SealedComm : public ::testing::TestWithParam<int> {};

TEST_P(SealedComm, EveryCollectiveMatchesReference) {
  const int n = GetParam();
  std::mutex mutex;
  std::vector<std::string> failures;
  expect_no_errors(on_ranks(n, [](int) { return RankSetup{}; }, [&](Communicator& c) {
    if (n > 1) EXPECT_TRUE(comm::is_encrypted(c)) << c.backend();
    crosstrain::testing::ConformanceOptions options;
    options.sizes = {0, 1, 7, 262147};
    options.all_dtypes = n <= 4;  // every dtype up to 4 ranks; float, int64 and bfloat16 beyond
    auto f = crosstrain::testing::run_conformance(c, options);
    std::lock_guard<std::mutex> lock(mutex);
    failures.insert(failures.end(), f.begin(), f.end());
  }));
  for (const auto& f : failures) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SealedComm, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(SealedGroups, WanSealsOnlyTheGroupsThatCrossClusters) {
  // Ranks 0, 1 in cluster 0 and 2, 3 in cluster 1.
  expect_no_errors(on_ranks(4, [](int r) { return RankSetup{EncryptMode::Wan, "s", r / 2, {}}; },
                            [](Communicator& c) {
    EXPECT_TRUE(comm::is_encrypted(c));
    // split() is collective over the world: every rank walks every group in the same order.
    auto cluster0 = c.split({0, 1});
    auto cluster1 = c.split({2, 3});
    auto cross_even = c.split({0, 2});
    auto cross_odd = c.split({1, 3});
    Communicator* mine_local = c.rank() < 2 ? cluster0.get() : cluster1.get();
    Communicator* mine_cross = c.rank() % 2 == 0 ? cross_even.get() : cross_odd.get();
    ASSERT_TRUE(mine_local && mine_cross);
    EXPECT_FALSE(comm::is_encrypted(*mine_local)) << "a group inside one cluster stays plain";
    EXPECT_TRUE(comm::is_encrypted(*mine_cross)) << "a group across clusters is sealed";
    at::Tensor t = at::full({5}, static_cast<float>(c.rank()));
    mine_cross->all_reduce(t, ReduceOp::Sum)->wait();
    const float want = c.rank() % 2 == 0 ? 0 + 2 : 1 + 3;
    EXPECT_TRUE(at::equal(t, at::full({5}, want)));
  }));
  // Ranks that do not know their cluster: hosts count, and these threads share one host.
  expect_no_errors(on_ranks(2, [](int) { return RankSetup{EncryptMode::Wan, "s", -1, {}}; },
                            [](Communicator& c) { EXPECT_FALSE(comm::is_encrypted(c)); }));
}

TEST(SealedGroups, NothingOnTheWireIsThePlaintext) {
  // A recognisable pattern of 4 KiB; the wire keeps every byte the ranks send each other.
  const at::Tensor known = at::arange(1024, at::kFloat).mul(3.25f).add(1000.0f);
  for (EncryptMode mode : {EncryptMode::Off, EncryptMode::All}) {
    std::mutex mutex;
    std::string wire;
    auto tap = [&](const at::Tensor& box, int, int) {
      std::lock_guard<std::mutex> lock(mutex);
      wire.append(static_cast<const char*>(box.data_ptr()), box.nbytes());
      return std::vector<at::Tensor>{box};
    };
    expect_no_errors(on_ranks(2, [&](int) { return RankSetup{mode, "s", -1, tap}; }, [&](Communicator& c) {
      at::Tensor t = c.rank() == 0 ? known.clone() : at::zeros({1024});
      if (c.rank() == 0) c.send(t, 1, 5)->wait();
      else c.recv(t, 0, 5)->wait();
      EXPECT_TRUE(at::equal(t, known));
      at::Tensor b = c.rank() == 0 ? known.clone() : at::zeros({1024});
      c.broadcast(b, 0)->wait();
      EXPECT_TRUE(at::equal(b, known));
    }));
    // 16 bytes of the pattern (four floats) anywhere on the wire: the plaintext went by.
    const std::string probe(static_cast<const char*>(known.data_ptr()) + 400, 16);
    if (mode == EncryptMode::Off) EXPECT_TRUE(contains(wire, probe)) << "the tap sees plain messages";
    else EXPECT_FALSE(contains(wire, probe)) << "sealed messages leak the plaintext";
  }
}

namespace {

// Rank 1's messages to rank 0 go through `attack`; rank 0 must fail naming rank 1, the operation and the step, and
// never return changed data. Each step all-reduces 4 MiB: the ring on 2 ranks sends 4 messages a step (two pieces
// of its reduce-scatter on one tag, then two of its all-gather on the next), so step 3's first is message 12.
void expect_detected(const std::string& what, const OnSend& attack) {
  SCOPED_TRACE(what);
  const auto errors = on_ranks(2, [&](int r) { return RankSetup{EncryptMode::All, "s", -1, r == 1 ? attack : OnSend{}}; },
                               [&](Communicator& c) {
    for (int step = 0; step < 6; ++step) {
      c.set_step(step);
      at::Tensor t = at::full({1 << 20}, static_cast<float>(c.rank() + step));
      c.all_reduce(t, ReduceOp::Sum)->wait(Millis(3000));
      EXPECT_TRUE(at::equal(t, at::full({1 << 20}, static_cast<float>(1 + 2 * step)))) << "step " << step;
    }
  }, Millis(2000));  // rank 1 then waits for rank 0, which stopped
  ASSERT_NE(errors[0], "") << "rank 0 accepted what the wire did";
  EXPECT_TRUE(contains(errors[0], "from rank 1")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "allreduce(sum)")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "step 3")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "did not authenticate")) << errors[0];
}

// An attack on the ring's messages (key confirmation passes untouched): `act` gets every message so far, the
// current one last, and returns what goes on the wire instead of it (nothing: dropped or held).
OnSend attack(std::function<std::vector<at::Tensor>(std::vector<at::Tensor>&)> act) {
  auto seen = std::make_shared<std::vector<at::Tensor>>();
  auto mutex = std::make_shared<std::mutex>();
  return [seen, mutex, act](const at::Tensor& box, int, int tag) -> std::vector<at::Tensor> {
    if (tag < comm::kSealedTagBase || tag >= comm::kSealedTagBase + 2) return {box};  // not the ring's
    std::lock_guard<std::mutex> lock(*mutex);
    seen->push_back(box.clone());
    return act(*seen);
  };
}

}  // namespace

TEST(SealedGroups, AChangedReplayedReorderedOrDroppedMessageIsDetected) {
  expect_detected("one bit flipped", attack([](std::vector<at::Tensor>& seen) -> std::vector<at::Tensor> {
    if (seen.size() != 13) return {seen.back()};
    at::Tensor t = seen.back().clone();
    t[100] = static_cast<uint8_t>(t[100].item<uint8_t>() ^ 1);
    return {t};
  }));
  expect_detected("step 2's first message replayed", attack([](std::vector<at::Tensor>& seen) -> std::vector<at::Tensor> {
    if (seen.size() != 13) return {seen.back()};
    return {seen[8], seen.back()};
  }));
  expect_detected("two pieces swapped", attack([](std::vector<at::Tensor>& seen) -> std::vector<at::Tensor> {
    if (seen.size() == 13) return {};                  // held back
    if (seen.size() == 14) return {seen[13], seen[12]};  // then sent after the next one
    return {seen.back()};
  }));
  expect_detected("a message dropped", attack([](std::vector<at::Tensor>& seen) -> std::vector<at::Tensor> {
    if (seen.size() == 13) return {};
    return {seen.back()};
  }));
}

// The error names the sender as evidence against it (CommContext::accused: elastic training excludes that rank),
// by its rank in the world group even when the message failed in a sub-group where its rank differs.
TEST(SealedGroups, AMessageThatDoesNotOpenAccusesItsSenderByWorldRank) {
  std::vector<int> accused(4, -2), peer(4, -2);
  const OnSend flip_all = [](const at::Tensor& box, int, int tag) -> std::vector<at::Tensor> {
    if (tag < comm::kSealedTagBase || tag >= comm::kSealedTagBase + 2) return {box};
    at::Tensor t = box.clone();
    t[t.numel() / 2] = static_cast<uint8_t>(t[t.numel() / 2].item<uint8_t>() ^ 1);
    return {t};
  };
  const auto errors = on_ranks(4, [&](int r) { return RankSetup{EncryptMode::Wan, "s", r / 2, r == 3 ? flip_all : OnSend{}}; },
                               [&](Communicator& c) {
    auto across = c.split({1, 3});  // clusters 0 and 1: sealed under wan; world rank 3 is its rank 1
    if (!across) return;
    ASSERT_TRUE(comm::is_encrypted(*across));
    at::Tensor t = at::ones({1 << 18});
    try {
      across->all_reduce(t, ReduceOp::Sum)->wait(Millis(3000));
    } catch (const CommError& e) {
      accused[c.rank()] = e.context().accused;
      peer[c.rank()] = e.context().peer;
    }
  }, Millis(2000));
  EXPECT_EQ(accused[1], 3) << "world rank 1 read world rank 3's changed message: " << errors[1];
  EXPECT_EQ(peer[1], 1) << "the peer is named by its rank in the group";
  EXPECT_NE(accused[3], 1) << "rank 3's messages were changed, not rank 1's";
}

TEST(SealedGroups, APeerWithAnotherSecretIsRefusedAtOnceNamingIt) {
  const auto errors = on_ranks(3, [](int r) { return RankSetup{EncryptMode::All, r == 2 ? "guessed" : "real", -1, {}}; },
                               [](Communicator&) {});
  ASSERT_NE(errors[0], "");
  EXPECT_TRUE(contains(errors[0], "key confirmation")) << errors[0];
  EXPECT_TRUE(contains(errors[0], "from rank 2")) << errors[0];
  EXPECT_TRUE(contains(errors[1], "from rank 2")) << errors[1];
  EXPECT_NE(errors[2], "");
}

TEST(SealedGroups, ModesAndSettings) {
  EXPECT_EQ(comm::resolve_encrypt_mode("auto", true), EncryptMode::Wan);
  EXPECT_EQ(comm::resolve_encrypt_mode("auto", false), EncryptMode::Off);
  EXPECT_EQ(comm::resolve_encrypt_mode("all", true), EncryptMode::All);
  EXPECT_EQ(comm::resolve_encrypt_mode("off", true), EncryptMode::Off);
  try {
    comm::resolve_encrypt_mode("wan", false);
    ADD_FAILURE() << "wan without a secret";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "CROSSTRAIN_SECRET")) << e.what();
  }
  EXPECT_THROW(comm::resolve_encrypt_mode("yes", true), UsageError);
}

namespace {

struct ClusterKey {
  ClusterKey() {
    if (sodium_init() < 0) throw std::runtime_error("sodium");
    crypto_sign_keypair(pk.data(), sk.data());
  }
  std::array<unsigned char, 32> pk{};
  std::array<unsigned char, 64> sk{};
};

// Ranks 0, 1 in cluster east and 2, 3 in west, each signing with `signer(rank)`'s key under the name `claims(rank)`;
// every rank accepts the keys in `trusted`.
std::vector<std::string> with_identities(const std::map<std::string, ClusterKey>& keys,
                                         const std::function<std::string(int)>& claims,
                                         const std::function<std::string(int)>& signer,
                                         const std::vector<std::string>& trusted) {
  return on_ranks(4, [&](int r) {
    RankSetup s{EncryptMode::Wan, "", r / 2, {}, {}};
    s.identity.identity_cluster = claims(r);
    const auto& sk = keys.at(signer(r)).sk;
    s.identity.identity_key.assign(sk.begin(), sk.end());
    for (const auto& name : trusted) s.identity.peer_keys[name] = keys.at(name).pk;
    return s;
  }, [](Communicator& c) {
    EXPECT_TRUE(comm::is_encrypted(c));
    at::Tensor t = at::full({100}, static_cast<float>(c.rank()));
    c.all_reduce(t, ReduceOp::Sum)->wait();
    EXPECT_TRUE(at::equal(t, at::full({100}, 6.0f)));
  });
}

}  // namespace

// Cluster identities (comm.identity, comm.peer_keys): groups are authenticated by the clusters' Ed25519 keys, with
// no job secret; a rank whose cluster is not trusted, or that signs with another cluster's key, is refused by all.
TEST(SealedGroups, ClusterIdentitiesAuthenticateGroupsWithoutASecret) {
  std::map<std::string, ClusterKey> keys;
  for (const char* name : {"east", "west", "mallory"}) keys[name];
  auto cluster_of = [](int r) { return std::string(r < 2 ? "east" : "west"); };
  expect_no_errors(with_identities(keys, cluster_of, cluster_of, {"east", "west"}));

  auto untrusted = with_identities(keys, [&](int r) { return r == 3 ? std::string("mallory") : cluster_of(r); },
                                   [&](int r) { return r == 3 ? std::string("mallory") : cluster_of(r); },
                                   {"east", "west"});
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(contains(untrusted[r], "rank 3 names cluster 'mallory', which comm.peer_keys does not hold"))
        << r << ": " << untrusted[r];

  auto posing = with_identities(keys, cluster_of, [&](int r) { return r == 1 ? std::string("mallory") : cluster_of(r); },
                                {"east", "west", "mallory"});
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(contains(posing[r], "rank 1's group key is not signed by cluster 'east''s key")) << r << ": " << posing[r];
}

// comm.identity and comm.peer_keys read from the files `crosstrain keys create` writes: a key others may read, a
// keys file without this cluster and a lone setting are refused naming the file; auto then means wan.
TEST(SealedGroups, IdentityFilesAreReadAndCheckedBeforeAnyGroupForms) {
  ClusterKey east;
  const std::string dir = ::testing::TempDir() + "/sealed-identity-" + std::to_string(getpid());
  std::filesystem::create_directories(dir);
  auto hex = [](const unsigned char* p, size_t n) {
    std::string s(2 * n + 1, '\0');
    sodium_bin2hex(s.data(), s.size(), p, n);
    s.pop_back();
    return s;
  };
  const std::string key = dir + "/east.key", keys = dir + "/keys.json", others = dir + "/others.json";
  std::ofstream(key) << "{\"cluster\": \"east\", \"public_key\": \"" << hex(east.pk.data(), 32) << "\", \"secret_key\": \""
                     << hex(east.sk.data(), 64) << "\"}";
  std::ofstream(keys) << "{\"east\": \"" << hex(east.pk.data(), 32) << "\"}";
  std::ofstream(others) << "{\"west\": \"" << hex(east.pk.data(), 32) << "\"}";
  chmod(key.c_str(), 0600);
  comm::CommConfig config;
  config.identity = key;
  config.peer_keys = keys;
  const comm::DataPlaneSecurity s = comm::data_plane_security(config, "", 0);
  EXPECT_EQ(s.mode, EncryptMode::Wan);
  EXPECT_EQ(s.identity_cluster, "east");
  ASSERT_EQ(s.identity_key.size(), 64u);
  EXPECT_TRUE(std::equal(s.identity_key.begin(), s.identity_key.end(), east.sk.begin()));
  auto refusal = [&](const comm::CommConfig& c) {
    try {
      comm::data_plane_security(c, "", 0);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  config.peer_keys = others;
  EXPECT_TRUE(contains(refusal(config), "lacks this cluster ('east')")) << refusal(config);
  config.peer_keys = keys;
  chmod(key.c_str(), 0644);
  EXPECT_TRUE(contains(refusal(config), "chmod 600")) << refusal(config);
  EXPECT_EQ(comm::data_plane_security(comm::CommConfig{}, "", 0).mode, EncryptMode::Off) << "no secret, no identity";
  std::filesystem::remove_all(dir);
}
