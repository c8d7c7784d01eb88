// The rendezvous store's challenge-response and job identity, without sockets: both sides of the handshake run
// here against each other, and every way a proof can be wrong must be refused.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "crosstrain/store/auth.h"
#include "crosstrain/store/protocol.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"

using namespace crosstrain;
using namespace crosstrain::comm::store;
using Clock = std::chrono::steady_clock;

namespace {

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// One handshake between a client holding `client_secret` and a server holding `server_secret`, the way
// StoreClient and StoreServer run it: the server's verdict on the client's proof, then (only once admitted, as
// the server sends its proof to admitted clients only) the client's verdict on the server's.
struct Outcome {
  ProofVerdict server;
  std::string client_objects = "(never saw the server's proof)";  // "" when the client accepts it
};
Outcome handshake(const std::string& client_secret, const std::string& server_secret, int rank = 1,
                  const std::string& job = "job-a") {
  const std::string nc = random_nonce(), ns = random_nonce();
  Outcome out;
  const std::string proof = client_secret.empty() ? "" : client_proof(client_secret, job, rank, 4, nc, ns);
  out.server = check_client_proof(server_secret, job, rank, 4, nc, ns, proof);
  if (out.server.admitted)
    out.client_objects = check_server_proof(client_secret, job, nc, ns, server_proof(server_secret, job, nc, ns));
  return out;
}

std::string write_file(const std::string& name, const std::string& text, mode_t mode) {
  const auto path = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove(path);
  std::ofstream(path) << text;
  chmod(path.c_str(), mode);
  return path.string();
}

}  // namespace

TEST(StoreAuth, TheRightSecretIsAdmittedBothWays) {
  Outcome o = handshake("s3cret", "s3cret");
  EXPECT_EQ(o.client_objects, "");
  EXPECT_TRUE(o.server.admitted) << o.server.reason;
}

TEST(StoreAuth, AWrongSecretIsRefusedBothWaysWithAFix) {
  Outcome o = handshake("guess", "s3cret");
  EXPECT_FALSE(o.server.admitted);
  EXPECT_TRUE(contains(o.server.reason, "wrong job secret; set CROSSTRAIN_SECRET")) << o.server.reason;
  EXPECT_EQ(o.server.log_why, "it did not prove the job secret");
}

TEST(StoreAuth, AClientWithoutTheSecretIsToldWhy) {
  Outcome o = handshake("", "s3cret");
  EXPECT_FALSE(o.server.admitted);
  EXPECT_EQ(o.server.log_why, "it has no job secret");
  EXPECT_TRUE(contains(o.server.reason, "set CROSSTRAIN_SECRET")) << o.server.reason;
}

TEST(StoreAuth, AProofAnswersOneChallengeOnly) {
  const std::string nc = random_nonce(), ns = random_nonce(), other = random_nonce();
  const std::string proof = client_proof("k", "job", 1, 4, nc, ns);
  EXPECT_TRUE(check_client_proof("k", "job", 1, 4, nc, ns, proof).admitted);
  // Replayed against a fresh server nonce, or for another rank, world size or job: refused.
  EXPECT_FALSE(check_client_proof("k", "job", 1, 4, nc, other, proof).admitted);
  EXPECT_FALSE(check_client_proof("k", "job", 0, 4, nc, ns, proof).admitted);
  EXPECT_FALSE(check_client_proof("k", "job", 1, 8, nc, ns, proof).admitted);
  EXPECT_FALSE(check_client_proof("k", "job-b", 1, 4, nc, ns, proof).admitted);
  // A server's proof reflected back as a client's: different labels, refused.
  EXPECT_FALSE(check_client_proof("k", "job", 1, 4, nc, ns, server_proof("k", "job", nc, ns)).admitted);
  // A truncated proof, or a client nonce that is not one.
  EXPECT_FALSE(check_client_proof("k", "job", 1, 4, nc, ns, proof.substr(0, 31)).admitted);
  EXPECT_FALSE(check_client_proof("k", "job", 1, 4, "", ns, client_proof("k", "job", 1, 4, "", ns)).admitted);
  // The server's proof is bound to both nonces and the secret; a client refuses a wrong or missing one.
  EXPECT_EQ(check_server_proof("k", "job", nc, ns, server_proof("k", "job", nc, ns)), "");
  EXPECT_NE(check_server_proof("k", "job", other, ns, server_proof("k", "job", nc, ns)), "");
  EXPECT_NE(check_server_proof("k", "job", nc, other, server_proof("k", "job", nc, ns)), "");
  EXPECT_TRUE(contains(check_server_proof("k", "job", nc, ns, server_proof("impostor", "job", nc, ns)),
                       "did not prove the job secret"));
  EXPECT_NE(check_server_proof("k", "job", nc, ns, ""), "");
  EXPECT_NE(check_server_proof("k", "job", nc, ns, client_proof("k", "job", 1, 4, nc, ns)), "");
}

TEST(StoreAuth, FieldsAreLengthPrefixedSoBoundariesCannotShift) {
  EXPECT_NE(server_proof("k", "ab", "c", "d"), server_proof("k", "a", "bc", "d"));
  EXPECT_EQ(server_proof("k", "ab", "c", "d"), server_proof("k", "ab", "c", "d"));
  EXPECT_EQ(server_proof("k", "ab", "c", "d").size(), kProofBytes);
}

TEST(StoreAuth, NoncesAndJobIdsAreFresh) {
  std::set<std::string> seen;
  for (int i = 0; i < 100; ++i) seen.insert(random_nonce());
  EXPECT_EQ(seen.size(), 100u);
  EXPECT_EQ(random_nonce().size(), kNonceBytes);
  const std::string id = new_job_id();
  EXPECT_EQ(id.size(), 16u);
  EXPECT_EQ(job_id_error(id), "");
  EXPECT_NE(new_job_id(), id);
}

TEST(StoreAuth, JobIdsMustMatchAndBePlainText) {
  EXPECT_EQ(job_mismatch("a", "a"), "");
  EXPECT_EQ(job_mismatch("", ""), "");
  const std::string why = job_mismatch("b", "a");
  EXPECT_TRUE(contains(why, "job id 'a'")) << why;
  EXPECT_TRUE(contains(why, "job id 'b'")) << why;
  EXPECT_TRUE(contains(job_mismatch("", "a"), "no job id"));
  EXPECT_EQ(job_id_error("run-7.step_2:x@y"), "");
  EXPECT_NE(job_id_error(""), "");
  EXPECT_NE(job_id_error("a\nforged log line"), "");
  EXPECT_NE(job_id_error(std::string(129, 'a')), "");
}

TEST(StoreAuth, TheJobIdComesFromTheLaunchersVariables) {
  EXPECT_EQ(detect_launch_env({}).job_id, "");
  EXPECT_EQ(detect_launch_env({{"TORCHELASTIC_RUN_ID", "tr"}}).job_id, "tr");
  EXPECT_EQ(detect_launch_env({{"TORCHELASTIC_RUN_ID", "tr"}, {"CROSSTRAIN_JOB_ID", "ct"}}).job_id, "ct");
  EXPECT_EQ(detect_launch_env({{"SLURM_JOB_ID", "42"}, {"SLURM_STEP_ID", "3"}}).job_id, "slurm-42.3");
  EXPECT_EQ(detect_launch_env({{"CROSSTRAIN_SECRET", "x"}}).secret, "x");
  try {
    detect_launch_env({{"CROSSTRAIN_JOB_ID", "a b"}});
    FAIL() << "a job id with a space was accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "CROSSTRAIN_JOB_ID")) << e.what();
  }
}

TEST(StoreAuth, RefusalLinesAreRateLimitedAndCountWhatWasLeftOut) {
  RefusalLog log(3, std::chrono::seconds(10));
  const auto t0 = Clock::now();
  int printed = 0;
  for (int i = 0; i < 1000; ++i) printed += log.line("10.0.0.9:4000", "it did not prove the job secret", t0).has_value();
  EXPECT_EQ(printed, 3);
  auto first = RefusalLog(3, std::chrono::seconds(10)).line("127.0.0.1:41234", "it did not prove the job secret", t0);
  ASSERT_TRUE(first);
  EXPECT_EQ(*first, "crosstrain: refused a store connection from 127.0.0.1:41234: it did not prove the job secret");
  // Once the window has passed, the next line says how many were not shown.
  auto later = log.line("10.0.0.9:4001", "it has no job secret", t0 + std::chrono::seconds(11));
  ASSERT_TRUE(later);
  EXPECT_TRUE(contains(*later, "(997 more refused connections not shown)")) << *later;
  EXPECT_TRUE(log.line("10.0.0.9:4002", "x", t0 + std::chrono::seconds(11)));
}

TEST(StoreAuth, ASecretFileMustBePrivateToItsOwner) {
  EXPECT_EQ(read_secret_file(write_file("secret-ok", "  s3cret\n", 0600)), "s3cret");
  try {
    read_secret_file(write_file("secret-open", "s3cret\n", 0644));
    FAIL() << "a world-readable secret file was accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "mode 0644")) << e.what();
    EXPECT_TRUE(contains(e.what(), "chmod 600")) << e.what();
  }
  EXPECT_THROW(read_secret_file(write_file("secret-group", "s3cret\n", 0640)), UsageError);
  EXPECT_THROW(read_secret_file(write_file("secret-empty", "\n", 0600)), UsageError);
  EXPECT_THROW(read_secret_file(::testing::TempDir() + "/no-such-secret"), UsageError);
}

TEST(StoreProtocolV2, TheHelloCarriesTheJobAndTheNonce) {
  Hello h;
  h.rank = 2;
  h.world_size = 4;
  h.job = "job-a";
  h.nonce = std::string("\0\x01\xff", 3);
  Hello back = decode_hello(encode_hello(h));
  EXPECT_EQ(back.job, "job-a");
  EXPECT_EQ(back.nonce, h.nonce);
  EXPECT_TRUE(back.extra.empty());
  EXPECT_EQ(kVersion, 3u);
}

TEST(StoreSession, FramesOpenOnlyOnceInOrderAndUnchanged) {
  const std::string nc = random_nonce(), ns = random_nonce();
  SessionSealer client(SessionSealer::Side::Client, "s3cret", "job-a", 1, 4, nc, ns);
  SessionSealer server(SessionSealer::Side::Server, "s3cret", "job-a", 1, 4, nc, ns);
  auto body_of = [](const std::vector<uint8_t>& sealed) {
    return std::vector<uint8_t>(sealed.begin() + kLengthBytes, sealed.end());
  };
  const std::vector<uint8_t> first = encode_frame(Message{Code::Set, {"key", "gloo-address-10.0.0.1"}});
  const std::vector<uint8_t> second = encode_frame(Message{Code::Get, {"key", "100"}});
  const auto s1 = client.seal(first), s2 = client.seal(second);
  EXPECT_EQ(s1.size(), first.size() + SessionSealer::kOverhead);
  EXPECT_EQ(std::string(s1.begin(), s1.end()).find("gloo-address"), std::string::npos) << "sent in the clear";
  // Changed on the way: one bit of the body, or of the length prefix (the associated data).
  auto flipped = body_of(s1);
  flipped[3] ^= 1;
  EXPECT_FALSE(server.open(s1.data(), flipped));
  std::vector<uint8_t> prefix(s1.begin(), s1.begin() + kLengthBytes);
  prefix[3] ^= 0x80;
  auto intact = body_of(s1);
  EXPECT_FALSE(server.open(prefix.data(), intact));
  // Reordered: the second frame first.
  auto b2 = body_of(s2);
  EXPECT_FALSE(server.open(s2.data(), b2));
  // In order they open to the bodies sent; the first again (a replay) does not.
  auto b1 = body_of(s1);
  ASSERT_TRUE(server.open(s1.data(), b1));
  EXPECT_EQ(b1, std::vector<uint8_t>(first.begin() + kLengthBytes, first.end()));
  b2 = body_of(s2);
  ASSERT_TRUE(server.open(s2.data(), b2));
  auto again = body_of(s1);
  EXPECT_FALSE(server.open(s1.data(), again));
  // Cut short.
  auto s3 = client.seal(first);
  auto cut = body_of(s3);
  cut.pop_back();
  EXPECT_FALSE(server.open(s3.data(), cut));
  // The client opens the server's replies (its own direction's key would not).
  auto reply = server.seal(encode_frame(Message{Code::Ok, {"v"}}));
  auto rb = body_of(reply);
  EXPECT_TRUE(client.open(reply.data(), rb));
  // Another secret, rank or pair of nonces: other keys.
  SessionSealer stranger(SessionSealer::Side::Server, "guess", "job-a", 1, 4, nc, ns);
  SessionSealer other_rank(SessionSealer::Side::Server, "s3cret", "job-a", 2, 4, nc, ns);
  for (SessionSealer* s : {&stranger, &other_rank}) {
    auto b = body_of(s1);
    EXPECT_FALSE(s->open(s1.data(), b));
  }
}
