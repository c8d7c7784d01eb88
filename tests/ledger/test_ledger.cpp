// The ledger of contributed compute without libtorch: keys, the hash chain, every tamper case verify must refuse
// (naming the line), appends that refuse a broken chain, and the spot check's sampling and work checks.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/ledger/ledger.h"
#include "scratch.h"

using namespace crosstrain::scheduler;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return crosstrain::testing::scratch_dir("ledger-" + name).string(); }

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

LedgerEntry claim(const std::string& cluster, int64_t first_step, int64_t steps, int64_t tokens_per_step = 1024) {
  LedgerEntry e;
  e.cluster = cluster;
  e.job = "job-1";
  e.interval_start = 1700000000 + first_step;
  e.interval_end = e.interval_start + steps;
  e.first_step = first_step;
  e.steps = steps;
  e.tokens = steps * tokens_per_step;
  e.flops = 6.0 * 124e6 * static_cast<double>(e.tokens);
  e.bytes = 1 << 20;
  for (int64_t s = first_step; s < first_step + steps; ++s) {
    const std::string payload = cluster + ":" + std::to_string(s);
    e.gradient_digests[s] = ledger_digest(payload.data(), payload.size());
  }
  return e;
}

// A ledger of `n` entries alternating between clusters a and b, with its keys.
struct Fixture {
  std::string dir, path;
  LedgerKey a, b;
  PublicKeys keys;
  explicit Fixture(const std::string& name, int n = 4) : dir(fresh_dir(name)), path(dir + "/ledger.jsonl") {
    a = generate_ledger_key("cluster-a");
    b = generate_ledger_key("cluster-b");
    keys = {{a.cluster, a.public_key}, {b.cluster, b.public_key}};
    for (int i = 0; i < n; ++i) append_ledger(path, claim(i % 2 ? "cluster-b" : "cluster-a", i * 10, 10), i % 2 ? b : a);
  }
};

// Replaces the first match of `pattern` on line `index` (0-based) with `with`.
void edit_line(const std::string& path, size_t index, const std::string& pattern, const std::string& with) {
  auto lines = read_lines(path);
  const std::string before = lines.at(index);
  lines[index] = std::regex_replace(before, std::regex(pattern), with, std::regex_constants::format_first_only);
  ASSERT_NE(lines[index], before) << "pattern " << pattern << " not found";
  write_lines(path, lines);
}

}  // namespace

TEST(Ledger, KeysRoundTripWithPrivateModeAndAreNeverOverwritten) {
  const std::string dir = fresh_dir("keys");
  const LedgerKey key = generate_ledger_key("alpha");
  const std::string secret = write_ledger_key(key, dir);
  struct stat st {};
  ASSERT_EQ(::stat(secret.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const LedgerKey back = read_ledger_key(secret);
  EXPECT_EQ(back.cluster, "alpha");
  EXPECT_EQ(back.secret_key, key.secret_key);
  EXPECT_EQ(read_public_keys(dir + "/keys.json").at("alpha"), key.public_key);
  // A second cluster joins the keys file; the first cannot be replaced.
  write_ledger_key(generate_ledger_key("beta"), dir);
  EXPECT_EQ(read_public_keys(dir + "/keys.json").size(), 2u);
  EXPECT_THROW(write_ledger_key(generate_ledger_key("alpha"), dir), crosstrain::UsageError);
  EXPECT_EQ(read_ledger_key(secret).secret_key, key.secret_key);
  // A key file others may read is refused, with the fix.
  ::chmod(secret.c_str(), 0644);
  try {
    read_ledger_key(secret);
    FAIL() << "a 0644 key file was accepted";
  } catch (const crosstrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  EXPECT_THROW(generate_ledger_key("../evil"), crosstrain::UsageError);
}

TEST(Ledger, AnHonestChainVerifiesWithTotalsPerCluster) {
  Fixture f("honest", 5);
  const LedgerVerifyReport r = verify_ledger(f.path, f.keys);
  ASSERT_TRUE(r.ok) << r.message();
  EXPECT_EQ(r.entries, 5);
  EXPECT_EQ(r.totals.at("cluster-a").entries, 3);
  EXPECT_EQ(r.totals.at("cluster-b").steps, 20);
  EXPECT_EQ(r.totals.at("cluster-a").tokens, 30 * 1024);
  EXPECT_DOUBLE_EQ(r.totals.at("cluster-b").flops, 6.0 * 124e6 * 20 * 1024);
  // Every line's hash is recomputable from its fields, and links to the previous one.
  EXPECT_EQ(r.parsed[0].prev_hash, std::string(64, '0'));
  for (size_t i = 1; i < r.parsed.size(); ++i) EXPECT_EQ(r.parsed[i].prev_hash, r.parsed[i - 1].hash);
  EXPECT_EQ(entry_hash(r.parsed[3]), r.parsed[3].hash);
  EXPECT_EQ(entry_line(r.parsed[2]), read_lines(f.path)[2]);
  // The expected head guards against cutting entries off the end.
  LedgerVerifyOptions head;
  head.expected_head = r.head_hash;
  EXPECT_TRUE(verify_ledger(f.path, f.keys, head).ok);
  auto lines = read_lines(f.path);
  lines.pop_back();
  write_lines(f.path, lines);
  const LedgerVerifyReport cut = verify_ledger(f.path, f.keys, head);
  EXPECT_FALSE(cut.ok);
  EXPECT_NE(cut.reason.find("expected head"), std::string::npos) << cut.reason;
}

TEST(Ledger, ChangedNumberIsRefusedNamingTheLine) {
  Fixture f("changed");
  edit_line(f.path, 2, "\"tokens\":10240", "\"tokens\":99999");
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 3);
  EXPECT_NE(r.reason.find("altered"), std::string::npos) << r.reason;
  EXPECT_EQ(r.entries, 2);
}

TEST(Ledger, ChangedNumberWithRecomputedHashFailsTheSignature) {
  Fixture f("rehashed");
  auto e = verify_ledger(f.path, f.keys).parsed[1];
  e.flops *= 10;
  e.hash = entry_hash(e);  // the forger can rehash but not re-sign as cluster-b
  auto lines = read_lines(f.path);
  lines[1] = entry_line(e);
  write_lines(f.path, lines);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 2);
  EXPECT_NE(r.reason.find("signature"), std::string::npos) << r.reason;
}

TEST(Ledger, RemovedLineIsRefused) {
  Fixture f("removed");
  auto lines = read_lines(f.path);
  lines.erase(lines.begin() + 1);
  write_lines(f.path, lines);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 2);
  EXPECT_NE(r.reason.find("removed"), std::string::npos) << r.reason;
}

TEST(Ledger, ReorderedLinesAreRefused) {
  Fixture f("reordered");
  auto lines = read_lines(f.path);
  std::swap(lines[1], lines[2]);
  write_lines(f.path, lines);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 2);
}

TEST(Ledger, ForgedSignatureIsRefused) {
  Fixture f("forged");
  // cluster-a signs an entry that claims to be cluster-b's (append itself would refuse: the key is not b's).
  const auto chain = verify_ledger(f.path, f.keys).parsed;
  LedgerEntry e = chain[3];
  e.steps = 1000;
  LedgerKey imposter = f.a;
  imposter.cluster = "cluster-b";
  seal_entry(e, 4, chain[2].hash, imposter);
  auto lines = read_lines(f.path);
  lines[3] = entry_line(e);
  write_lines(f.path, lines);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 4);
  EXPECT_NE(r.reason.find("signature is not cluster \"cluster-b\"'s"), std::string::npos) << r.reason;
}

TEST(Ledger, UnknownClusterIsRefused) {
  Fixture f("unknown");
  const LedgerKey stranger = generate_ledger_key("stranger");
  append_ledger(f.path, claim("stranger", 100, 5), stranger, f.keys);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 5);
  EXPECT_NE(r.reason.find("unknown contributor"), std::string::npos) << r.reason;
  PublicKeys with_stranger = f.keys;
  with_stranger[stranger.cluster] = stranger.public_key;
  EXPECT_TRUE(verify_ledger(f.path, with_stranger).ok);
}

TEST(Ledger, TruncatedLastLineIsRefusedAndBlocksAppends) {
  Fixture f("truncated");
  const auto size = fs::file_size(f.path);
  fs::resize_file(f.path, size - 40);
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 4);
  EXPECT_NE(r.reason.find("incomplete last line"), std::string::npos) << r.reason;
  EXPECT_THROW(append_ledger(f.path, claim("cluster-a", 40, 10), f.a, f.keys), crosstrain::UsageError);
  EXPECT_EQ(fs::file_size(f.path), size - 40);  // the refused append wrote nothing
}

// The signature covers the values, not the bytes: verify rebuilds the canonical form, so reformatting a line
// (spaces after the colons) changes nothing, while a field the signature does not cover is refused.
TEST(Ledger, AddedFieldIsRefusedButReformattingIsHarmless) {
  Fixture f("field");
  auto lines = read_lines(f.path);
  lines[1] = std::regex_replace(lines[1], std::regex("\":"), "\": ");
  write_lines(f.path, lines);
  EXPECT_TRUE(verify_ledger(f.path, f.keys).ok) << verify_ledger(f.path, f.keys).message();
  edit_line(f.path, 0, "\\}$", ",\"note\":\"paid\"}");
  const auto r = verify_ledger(f.path, f.keys);
  EXPECT_FALSE(r.ok);
  EXPECT_EQ(r.bad_line, 1);
  EXPECT_NE(r.reason.find("unknown field"), std::string::npos) << r.reason;
}

TEST(Ledger, AppendRefusesAChainThatDoesNotVerify) {
  Fixture f("refuse");
  edit_line(f.path, 1, "\"steps\":10", "\"steps\":11");
  try {
    append_ledger(f.path, claim("cluster-a", 40, 10), f.a, f.keys);
    FAIL() << "appended to a tampered chain";
  } catch (const crosstrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
  }
  EXPECT_EQ(read_lines(f.path).size(), 4u);
  EXPECT_THROW(append_ledger(f.path, claim("cluster-b", 40, 10), f.a, f.keys), crosstrain::UsageError);  // wrong key
}

// A cluster without the ledger's disk seals its entry after the head it read and sends the line (POST
// /api/ledger): appended when it is the next entry and signed by its cluster; a chain that moved on meanwhile is
// a conflict (read again); a forged or unknown cluster's line is refused; nothing is appended then.
TEST(Ledger, AnEntrySealedElsewhereIsAppendedOnlyAfterTheHeadItWasSealedAfter) {
  Fixture f("sealed");
  const LedgerVerifyReport before = verify_ledger(f.path, f.keys);
  LedgerEntry next = claim("cluster-a", 40, 10);
  seal_entry(next, before.entries + 1, before.head_hash, f.a);
  LedgerEntry late = claim("cluster-b", 50, 10);
  seal_entry(late, before.entries + 1, before.head_hash, f.b);  // sealed after the same head
  EXPECT_EQ(append_sealed_entry(f.path, entry_line(next), f.keys).seq, 5);
  EXPECT_THROW(append_sealed_entry(f.path, entry_line(late), f.keys), LedgerConflict);
  seal_entry(late, 6, next.hash, f.b);  // read again: sealed after the new head
  EXPECT_EQ(append_sealed_entry(f.path, entry_line(late), f.keys).seq, 6);
  EXPECT_TRUE(verify_ledger(f.path, f.keys).ok);
  LedgerEntry forged = claim("cluster-a", 60, 10);
  seal_entry(forged, 7, late.hash, f.b);  // cluster b signs an entry of cluster a
  EXPECT_THROW(append_sealed_entry(f.path, entry_line(forged), f.keys), crosstrain::UsageError);
  const LedgerKey mallory = generate_ledger_key("mallory");
  LedgerEntry stranger = claim("mallory", 70, 10);
  seal_entry(stranger, 7, late.hash, mallory);
  EXPECT_THROW(append_sealed_entry(f.path, entry_line(stranger), f.keys), crosstrain::UsageError);
  EXPECT_THROW(append_sealed_entry(f.path, "{\"seq\": 7}", f.keys), crosstrain::UsageError);
  EXPECT_EQ(read_lines(f.path).size(), 6u);
  EXPECT_TRUE(verify_ledger(f.path, f.keys).ok);
}

TEST(Ledger, SampledStepsAreDeterministicDistinctAndInRange) {
  Fixture f("sample", 2);
  const auto e = verify_ledger(f.path, f.keys).parsed[1];
  const auto s1 = sample_steps(e, 42, 4), s2 = sample_steps(e, 42, 4), s3 = sample_steps(e, 43, 4);
  EXPECT_EQ(s1, s2);
  EXPECT_NE(s1, s3);
  ASSERT_EQ(s1.size(), 4u);
  for (size_t i = 0; i < s1.size(); ++i) {
    EXPECT_GE(s1[i], e.first_step);
    EXPECT_LT(s1[i], e.first_step + e.steps);
    if (i) {
      EXPECT_LT(s1[i - 1], s1[i]);
    }
  }
  EXPECT_EQ(sample_steps(e, 1, 50).size(), static_cast<size_t>(e.steps));
}

TEST(Ledger, SpotCheckFlagsInflatedWorkDoubleClaimsAndMissingDigests) {
  std::vector<LedgerEntry> entries = {claim("honest", 0, 10), claim("inflator", 10, 10), claim("copier", 5, 10),
                                      claim("lazy", 30, 10)};
  entries[1].tokens *= 3;                       // inflated tokens
  entries[3].gradient_digests.clear();          // claims steps it committed nothing for
  for (size_t i = 0; i < entries.size(); ++i) {
    entries[i].seq = static_cast<int64_t>(i + 1);
    entries[i].hash = std::string(64, static_cast<char>('a' + i));
  }
  SpotCheckOptions options;
  options.seed = 7;
  options.jobs["job-1"] = {1024, 6.0 * 124e6};
  // The checker "recomputes" what an honest cluster would have reported.
  const Recompute recompute = [&](const std::string&, int64_t step) {
    for (const auto& e : entries)
      if (step >= e.first_step && step < e.first_step + e.steps) {
        const std::string payload = e.cluster + ":" + std::to_string(step);
        return ledger_digest(payload.data(), payload.size());
      }
    return std::string();
  };
  const auto report = spot_check(entries, options, recompute);
  EXPECT_EQ(report.flagged_clusters(), (std::vector<std::string>{"copier", "inflator", "lazy"}));
  auto has_flag = [&](const std::string& cluster, const std::string& reason) {
    for (const auto& flag : report.flags)
      if (flag.cluster == cluster && flag.reason.find(reason) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has_flag("inflator", "30720 tokens for 10 steps"));
  EXPECT_TRUE(has_flag("copier", "already claimed by cluster"));
  EXPECT_TRUE(has_flag("lazy", "committed no gradient digest"));
  EXPECT_GE(report.steps_matched, 2);
  // Inflated FLOPs alone are caught too.
  std::vector<LedgerEntry> flops_only = {claim("x", 0, 4)};
  flops_only[0].flops *= 1.5;
  EXPECT_EQ(spot_check(flops_only, options, recompute).flagged_clusters(), std::vector<std::string>{"x"});
}

// 10,000 entries of 4 steps each (every step's digest committed): verify must stay fast enough to run on every
// append and in CI. The figure is printed for docs/ledger.md; the bound is loose (2 shared cores).
TEST(Ledger, VerifiesTenThousandEntriesQuickly) {
  const LedgerKey a = generate_ledger_key("a");
  const PublicKeys keys = {{"a", a.public_key}};
  std::string text, head;
  for (int64_t i = 0; i < 10000; ++i) {
    LedgerEntry e = claim("a", i * 4, 4);
    seal_entry(e, i + 1, head, a);
    head = e.hash;
    text += entry_line(e) + "\n";
  }
  const auto start = std::chrono::steady_clock::now();
  const auto r = verify_ledger_text(text, keys);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(r.ok) << r.message();
  EXPECT_EQ(r.entries, 10000);
  EXPECT_EQ(r.head_hash, head);
  std::printf("verify: 10000 entries (%.1f MiB) in %.3f s, %.0f entries/s\n", text.size() / 1048576.0, seconds,
              10000 / seconds);
  EXPECT_LT(seconds, 10.0);
  // An append re-verifies the chain under its lock: on a 10,000-entry file it costs about one verify.
  const std::string path = fresh_dir("speed") + "/ledger.jsonl";
  std::ofstream(path) << text;
  const auto append_start = std::chrono::steady_clock::now();
  const LedgerEntry appended = append_ledger(path, claim("a", 40000, 4), a, keys);
  const double append_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - append_start).count();
  EXPECT_EQ(appended.seq, 10001);
  EXPECT_EQ(appended.prev_hash, head);
  std::printf("append to a 10000-entry ledger: %.3f s\n", append_s);
}
