// `crosstrain ledger` as a user runs it: keygen, append, verify (a summary per cluster, or a non-zero exit and
// one line naming the bad line of a tampered ledger), show.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "scratch.h"
#include "subprocess.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;

struct LedgerDir {
  std::string dir, ledger, keys;
  LedgerDir(const std::string& name)
      : dir(crosstrain::testing::scratch_dir("ledger-cli-" + name).string()),
        ledger(dir + "/ledger.jsonl"),
        keys(dir + "/keys/keys.json") {
  }
  ~LedgerDir() { fs::remove_all(dir); }
  ProcessResult run(std::vector<std::string> args) {
    args.insert(args.begin(), kBin);
    return run_process(args, {}, milliseconds(30000));
  }
  ProcessResult append(const std::string& cluster, int steps, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"ledger", "append", ledger, "--cluster", cluster, "--key",
                                     dir + "/keys/" + cluster + ".key", "--job", "gpt", "--steps",
                                     std::to_string(steps), "--tokens", std::to_string(steps * 2048), "--flops",
                                     std::to_string(steps * 2048 * 6e8), "--bytes", "4096"};
    args.insert(args.end(), extra.begin(), extra.end());
    return run(args);
  }
  std::vector<std::string> lines() const {
    std::ifstream in(ledger);
    std::vector<std::string> out;
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  void write(const std::vector<std::string>& lines) const {
    std::ofstream out(ledger, std::ios::trunc);
    for (const auto& l : lines) out << l << "\n";
  }
};

// Two clusters with keys, three entries.
void fill(LedgerDir& d) {
  for (const char* c : {"east", "west"}) {
    auto r = d.run({"ledger", "keygen", "--cluster", c, "--out", d.dir + "/keys"});
    ASSERT_EQ(r.exit_code(), 0) << r.output;
  }
  const std::string digest(64, 'e');
  for (auto [cluster, steps] : std::vector<std::pair<std::string, int>>{{"east", 10}, {"west", 5}, {"east", 7}}) {
    auto r = d.append(cluster, steps, {"--keys", d.keys, "--digest", "0=" + digest});
    ASSERT_EQ(r.exit_code(), 0) << r.output;
  }
}

}  // namespace

TEST(LedgerCli, KeygenAppendVerifyShow) {
  LedgerDir d("ok");
  fill(d);
  struct stat st {};
  ASSERT_EQ(::stat((d.dir + "/keys/east.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto r = d.run({"ledger", "verify", d.ledger, "--keys", d.keys});
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(contains(r.output, "3 entries, chain and signatures verified")) << r.output;
  // Per-cluster totals: east 2 entries, 17 steps, 17 * 2048 tokens; west 1 entry, 5 steps.
  EXPECT_TRUE(std::regex_search(r.output, std::regex("east +2 +17 +34816 "))) << r.output;
  EXPECT_TRUE(std::regex_search(r.output, std::regex("west +1 +5 +10240 "))) << r.output;
  // Steps continue where the job's last entry stopped.
  auto show = d.run({"ledger", "show", d.ledger});
  ASSERT_EQ(show.exit_code(), 0) << show.output;
  EXPECT_TRUE(std::regex_search(show.output, std::regex("3 +east +gpt +15 +7 "))) << show.output;
}

TEST(LedgerCli, TamperedLedgersAreRefusedNamingTheLine) {
  LedgerDir d("tamper");
  fill(d);
  const auto good = d.lines();
  auto verify = [&] { return d.run({"ledger", "verify", d.ledger, "--keys", d.keys}); };
  // A changed number.
  auto changed = good;
  changed[1] = std::regex_replace(changed[1], std::regex("\"steps\":5,"), "\"steps\":50,");
  ASSERT_NE(changed[1], good[1]);
  d.write(changed);
  auto r = verify();
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.output, "line 2: hash does not match")) << r.output;
  // ... and appending to it is refused, writing nothing.
  auto refused = d.append("east", 3);
  EXPECT_NE(refused.exit_code(), 0);
  EXPECT_TRUE(contains(refused.output, "refusing to append")) << refused.output;
  EXPECT_EQ(d.lines().size(), 3u);
  // A removed line.
  d.write({good[0], good[2]});
  r = verify();
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.output, "line 2: seq 3 where 2 was expected")) << r.output;
  // A truncated last line.
  d.write(good);
  fs::resize_file(d.ledger, fs::file_size(d.ledger) - 10);
  r = verify();
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.output, "line 3: incomplete last line")) << r.output;
  // An unknown cluster: verified against a keys file that lacks west.
  d.write(good);
  std::string east_public;
  std::ifstream(d.dir + "/keys/east.pub") >> east_public;
  std::ofstream(d.dir + "/east-only.json") << "{\"east\": \"" << east_public << "\"}\n";
  r = d.run({"ledger", "verify", d.ledger, "--keys", d.dir + "/east-only.json"});
  EXPECT_NE(r.exit_code(), 0);
  EXPECT_TRUE(contains(r.output, "line 2: cluster \"west\" has no public key")) << r.output;
  // The untouched ledger still verifies.
  EXPECT_EQ(verify().exit_code(), 0);
}

// `crosstrain keys` (issue 34): identities made, shown with their fingerprints, checked for permissions, rotated
// in one command (the old key kept aside, the ledger it signed still verifiable), and job secrets made private.
TEST(KeysCli, CreateShowRotateAndMakeASecret) {
  LedgerDir d("keys");
  const std::string keys = d.dir + "/keys";
  ASSERT_EQ(d.run({"keys", "create", "--cluster", "east", "--dir", keys}).exit_code(), 0);
  ASSERT_EQ(d.run({"keys", "create", "--cluster", "west", "--dir", keys}).exit_code(), 0);
  EXPECT_NE(d.run({"keys", "create", "--cluster", "east", "--dir", keys}).exit_code(), 0) << "a key was overwritten";
  auto shown = d.run({"keys", "show", "--dir", keys});
  EXPECT_EQ(shown.exit_code(), 0) << shown.output;
  const std::regex east_line("east +(SHA256:[0-9a-f]{16}) +ok");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(shown.output, m, east_line)) << shown.output;
  const std::string before = m[1];
  // East signs a ledger entry, then rotates its key.
  ASSERT_EQ(d.append("east", 10).exit_code(), 0);
  auto rotated = d.run({"keys", "rotate", "--cluster", "east", "--dir", keys});
  ASSERT_EQ(rotated.exit_code(), 0) << rotated.output;
  shown = d.run({"keys", "show", "--dir", keys});
  ASSERT_TRUE(std::regex_search(shown.output, m, east_line)) << shown.output;
  EXPECT_NE(m[1], before) << "the fingerprint did not change";
  // The old entry verifies with the retired keys file the rotation kept, not with the new one.
  std::string retired;
  for (const auto& e : fs::directory_iterator(keys))
    if (e.path().filename().string().rfind("keys.json.retired-", 0) == 0) retired = e.path().string();
  ASSERT_FALSE(retired.empty());
  EXPECT_EQ(d.run({"ledger", "verify", d.ledger, "--keys", retired}).exit_code(), 0);
  EXPECT_NE(d.run({"ledger", "verify", d.ledger, "--keys", d.keys}).exit_code(), 0);
  // A key others may read is reported, and the command fails.
  chmod((keys + "/west.key").c_str(), 0644);
  shown = d.run({"keys", "show", "--dir", keys});
  EXPECT_NE(shown.exit_code(), 0);
  EXPECT_NE(shown.output.find("chmod 600"), std::string::npos) << shown.output;
  // A job secret: 64 hex digits, mode 0600, never overwritten.
  const std::string secret = d.dir + "/job.secret";
  ASSERT_EQ(d.run({"keys", "secret", "--out", secret}).exit_code(), 0);
  struct stat st {};
  ASSERT_EQ(stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_size, 65);
  EXPECT_NE(d.run({"keys", "secret", "--out", secret}).exit_code(), 0);
}
