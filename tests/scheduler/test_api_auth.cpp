// Who may call the scheduler's API (scheduler/api_auth.h): tokens and their roles, and the signatures clusters put
// on their registrations and link reports.
#include "crosstrain/scheduler/api_auth.h"

#include <gtest/gtest.h>
#include <sodium.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "scratch.h"

namespace crosstrain::scheduler {
namespace {

namespace fs = std::filesystem;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(ApiTokens, RolesComeFromTheFileAndUnknownTokensHaveNone) {
  const ApiTokens t = ApiTokens::parse("# ops\nadmin 0123456789abcdef0123\nread  fedcba9876543210fedc # the dashboard\n",
                                       "tokens");
  EXPECT_EQ(t.role_of("Bearer 0123456789abcdef0123"), ApiRole::Admin);
  EXPECT_EQ(t.role_of("Bearer fedcba9876543210fedc"), ApiRole::Read);
  EXPECT_EQ(t.role_of("Bearer 0123456789abcdef012"), ApiRole::None) << "a prefix of a token";
  EXPECT_EQ(t.role_of("0123456789abcdef0123"), ApiRole::None) << "not a bearer header";
  EXPECT_EQ(t.role_of(""), ApiRole::None);
  EXPECT_EQ(t.token(ApiRole::Read), "fedcba9876543210fedc");
  for (const char* bad : {"root 0123456789abcdef0123\n", "admin short\n", "admin 0123456789abcdef0123 extra\n", "# none\n"})
    EXPECT_THROW(ApiTokens::parse(bad, "tokens"), UsageError) << bad;
}

TEST(ApiTokens, TheDaemonMakesAPrivateFileOnceAndRefusesOneOthersCanRead) {
  const fs::path dir = crosstrain::testing::scratch_dir("api-tokens");
  const std::string path = (dir / "state.db.tokens").string();
  const ApiTokens made = ApiTokens::load_or_create(path);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_GE(made.token(ApiRole::Admin).size(), 32u);
  EXPECT_NE(made.token(ApiRole::Admin), made.token(ApiRole::Read));
  // The second start reads the same tokens.
  EXPECT_EQ(ApiTokens::load_or_create(path).token(ApiRole::Admin), made.token(ApiRole::Admin));
  chmod(path.c_str(), 0644);
  try {
    ApiTokens::load(path);
    ADD_FAILURE() << "a world-readable tokens file was accepted";
  } catch (const UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "chmod 600")) << e.what();
  }
  fs::remove_all(dir);
}

struct Keys {
  Keys() {
    if (sodium_init() < 0) throw std::runtime_error("sodium");
    crypto_sign_keypair(pk, sk);
    crypto_sign_keypair(other_pk, other_sk);
  }
  unsigned char pk[32], sk[64], other_pk[32], other_sk[64];
};

TEST(SignedRequests, OnlyTheClustersOwnFreshUnchangedSignatureIsAccepted) {
  Keys k;
  ClusterKeys keys;
  std::copy(k.pk, k.pk + 32, keys["south"].begin());
  std::copy(k.other_pk, k.other_pk + 32, keys["east"].begin());
  RequestVerifier v(keys);
  const int64_t now = 1'800'000'000;
  const std::string body = "name = \"south\"\n";
  const std::string good = sign_request("south", k.sk, "POST", "/api/clusters", body, now);
  EXPECT_EQ(v.verify(good, "POST", "/api/clusters", body, now + 10).cluster, "south");
  EXPECT_TRUE(contains(v.verify(good, "POST", "/api/clusters", body, now + 20).error, "replay"));
  auto error_of = [&](const std::string& header, const std::string& path, const std::string& b, int64_t at) {
    return v.verify(header, "POST", path, b, at).error;
  };
  const std::string fresh = sign_request("south", k.sk, "POST", "/api/clusters", body, now + 1);
  EXPECT_TRUE(contains(error_of(fresh, "/api/clusters", body + " ", now), "does not match")) << "changed body";
  EXPECT_TRUE(contains(error_of(fresh, "/api/links", body, now), "does not match")) << "another path";
  EXPECT_TRUE(contains(error_of(fresh, "/api/clusters", body, now + 1000), "from the scheduler's clock")) << "stale";
  // East's key posing as south, and a cluster the scheduler has no key for.
  const std::string posing = sign_request("south", k.other_sk, "POST", "/api/clusters", body, now + 2);
  EXPECT_TRUE(contains(error_of(posing, "/api/clusters", body, now), "does not match"));
  const std::string stranger = sign_request("north", k.sk, "POST", "/api/clusters", body, now + 3);
  EXPECT_TRUE(contains(error_of(stranger, "/api/clusters", body, now), "no public key for cluster 'north'"));
  EXPECT_TRUE(contains(error_of("", "/api/clusters", body, now), "must be signed"));
  EXPECT_TRUE(contains(error_of("south 12 ab zz", "/api/clusters", body, now), "is more than 300 s"));
  EXPECT_TRUE(contains(error_of("south", "/api/clusters", body, now), "CLUSTER UNIX_TIME NONCE SIGNATURE"));
  // The same request signed twice in the same second: two requests (fresh nonces), not a replay.
  const std::string once = sign_request("south", k.sk, "POST", "/api/clusters", body, now + 4);
  const std::string twice = sign_request("south", k.sk, "POST", "/api/clusters", body, now + 4);
  EXPECT_NE(once, twice);
  EXPECT_EQ(v.verify(once, "POST", "/api/clusters", body, now).cluster, "south");
  EXPECT_EQ(v.verify(twice, "POST", "/api/clusters", body, now).cluster, "south");
}

}  // namespace
}  // namespace crosstrain::scheduler
