// Claims from training (docs/ledger.md, "Claims from training"): a real run across two clusters writes each
// cluster's work log (run.work_log = true); `ledger claim` signs each cluster's steps once; `ledger spot-check`
// passes the honest claims, flags a contributor that fakes its work, and refuses a tampered ledger. Plus the
// pieces in-process: the work log's digest is the ledger's digest, its reader, and shared-step claims.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "cli_fixture.h"
#include "crosstrain/ledger/ledger.h"
#include "crosstrain/train/config.h"
#include "crosstrain/ledger/work_log.h"

using namespace crosstrain::testing;
using namespace crosstrain::scheduler;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : lines) out << l << "\n";
}

ProcessResult ct(std::vector<std::string> args) {
  args.insert(args.begin(), kBin);
  return run_process(args, {}, milliseconds(30000));
}

// Node `node` of 2 (one rank each), in cluster `node`: `crosstrain run --cluster` sets CROSSTRAIN_CLUSTER. A
// checkpoint every step, for the checker's recomputation.
std::vector<std::string> node_command(int node, int port, const std::string& run_dir, int steps,
                                      const std::vector<std::string>& extra) {
  std::vector<std::string> train = tiny_args(run_dir, 1, steps);
  train.insert(train.end(), {"--set", "run.work_log=true", "--set", "train.eval_every=0", "--set",
                             "train.checkpoint_every=1", "--set", "train.keep_checkpoints=0"});
  train.insert(train.end(), extra.begin(), extra.end());
  return two_node_run(node, port, train);
}

// Both nodes of a run; the output of both when one fails.
std::string train_two_clusters(const std::string& run_dir, int steps, const std::vector<std::string>& extra = {}) {
  const int port = free_port();
  Process node0(node_command(0, port, run_dir, steps, extra)), node1(node_command(1, port, run_dir, steps, extra));
  auto r0 = node0.wait(milliseconds(120000));
  auto r1 = node1.wait(milliseconds(30000));
  if (r0.exit_code() == 0 && r1.exit_code() == 0) return "";
  return r0.output + "\n--- node 1 ---\n" + r1.output;
}

// The checker's recomputation of step `step`: the same layout and clusters, from the run's checkpoint of the step
// before (step 1: from the initial weights), into a folder of its own. Returns that folder.
std::string recompute_step(const std::string& run, int step, const std::string& into) {
  fs::create_directories(into + "/checkpoints");
  std::vector<std::string> extra = {"--set", "train.steps=" + std::to_string(step)};
  if (step > 1) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d", step - 1);
    fs::copy(run + "/checkpoints/" + name, into + "/checkpoints/" + name, fs::copy_options::recursive);
    extra.push_back("--resume");
  }
  const std::string failed = train_two_clusters(into, step, extra);
  EXPECT_EQ(failed, "");
  return into;
}

struct Dir {
  std::string dir;
  explicit Dir(const std::string& name) : dir(fresh_dir(name + "_" + std::to_string(::getpid()))) {
    fs::create_directories(dir);
  }
  ~Dir() { fs::remove_all(dir); }
};

}  // namespace

// (a)-(d) on one training run: 6 steps, global batch 8 x 32 tokens = 256 tokens a step, 128 per cluster.
TEST(LedgerClaims, TrainingAcrossTwoClustersIsClaimedOnceAndSpotChecked) {
  constexpr int kSteps = 6;
  constexpr int64_t kStepTokens = 8 * 32, kClusterTokens = kStepTokens / 2;
  Dir d("ct_ledger_claims");
  const std::string run = d.dir + "/run", ledger = d.dir + "/ledger.jsonl", keys = d.dir + "/keys/keys.json";
  const auto before = std::chrono::system_clock::now();
  ASSERT_EQ(train_two_clusters(run, kSteps), "");

  // (a) One line per step in each cluster's log: the cluster's tokens, bytes sent, a digest of its own gradient.
  const double t0 = std::chrono::duration<double>(before.time_since_epoch()).count();
  std::map<int, std::vector<crosstrain::train::WorkRecord>> logs;
  for (int k : {0, 1}) {
    logs[k] = crosstrain::train::read_work_log(run + "/work/cluster" + std::to_string(k) + ".jsonl");
    ASSERT_EQ(logs[k].size(), static_cast<size_t>(kSteps)) << "cluster " << k;
    std::set<std::string> digests;
    for (int i = 0; i < kSteps; ++i) {
      const auto& r = logs[k][i];
      EXPECT_EQ(r.step, i + 1);
      EXPECT_EQ(r.tokens, kClusterTokens);
      EXPECT_GT(r.bytes, 0) << "its half of the gradient all-reduce";
      EXPECT_GE(r.time, t0 - 1);
      digests.insert(r.digest);
    }
    EXPECT_EQ(digests.size(), static_cast<size_t>(kSteps)) << "a new gradient every step";
  }
  for (int i = 0; i < kSteps; ++i) EXPECT_NE(logs[0][i].digest, logs[1][i].digest) << "other data, other gradient";
  EXPECT_FALSE(fs::exists(run + "/work/cluster2.jsonl"));

  // (b) Each cluster claims its steps; a second claim finds nothing new; the chain verifies.
  for (const char* c : {"east", "west", "mallory"})
    ASSERT_EQ(ct({"ledger", "keygen", "--cluster", c, "--out", d.dir + "/keys"}).exit_code(), 0);
  auto claim = [&](const std::string& cluster, int index) {
    return ct({"ledger", "claim", ledger, "--run-dir", run, "--cluster", cluster, "--cluster-index",
               std::to_string(index), "--key", d.dir + "/keys/" + cluster + ".key", "--job", "gpt", "--keys", keys});
  };
  auto c0 = claim("east", 0);
  ASSERT_EQ(c0.exit_code(), 0) << c0.output;
  EXPECT_TRUE(contains(c0.output, "claimed steps 1-6 of job gpt for east: 768 tokens")) << c0.output;
  auto c1 = claim("west", 1);
  ASSERT_EQ(c1.exit_code(), 0) << c1.output;
  auto again = claim("east", 0);
  ASSERT_EQ(again.exit_code(), 0) << again.output;
  EXPECT_TRUE(contains(again.output, "nothing to claim")) << again.output;
  ASSERT_EQ(read_lines(ledger).size(), 2u);
  auto verify = ct({"ledger", "verify", ledger, "--keys", keys});
  ASSERT_EQ(verify.exit_code(), 0) << verify.output;
  EXPECT_TRUE(std::regex_search(verify.output, std::regex("east +1 +6 +768 "))) << verify.output;
  // The entry carries the log's digests, and FLOPs = tokens x the model's FLOPs per token (run.dir/config.toml).
  const auto entry = nlohmann::json::parse(read_lines(ledger)[0]);
  for (const auto& r : logs[0]) EXPECT_EQ(entry["gradient_digests"][std::to_string(r.step)], r.digest);
  const double per_token = crosstrain::train::load_config(run + "/config.toml").model.flops_per_token();
  EXPECT_DOUBLE_EQ(entry["flops"].get<double>(), 768 * per_token);

  // Honest claims pass the spot check.
  char flops_text[32];
  std::snprintf(flops_text, sizeof flops_text, "%.17g", per_token);
  auto spot = [&](const std::string& on, std::vector<std::string> extra) {
    std::vector<std::string> args = {"ledger", "spot-check", on, "--keys", keys, "--job", "gpt",
                                     "--tokens-per-step", std::to_string(kStepTokens), "--flops-per-token",
                                     flops_text, "--seed", "7"};
    args.insert(args.end(), extra.begin(), extra.end());
    return ct(args);
  };
  auto honest = spot(ledger, {"--samples", "3"});
  EXPECT_EQ(honest.exit_code(), 0) << honest.output;
  EXPECT_TRUE(contains(honest.output, "0 recomputed (0 matched), 6 with a committed digest not recomputed")) << honest.output;
  EXPECT_TRUE(contains(honest.output, "0 flags")) << honest.output;

  // The checker re-runs each cluster's sampled step from the run's checkpoints: the digests match bit for bit.
  auto samples = spot(ledger, {"--samples", "1", "--list-samples"});
  ASSERT_EQ(samples.exit_code(), 0) << samples.output;
  std::vector<std::string> recomputed;
  std::set<int> sampled;
  const std::regex sample_line(R"(\(steps 1-6\): (\d+))");
  for (std::sregex_iterator m(samples.output.begin(), samples.output.end(), sample_line), end;
       m != end; ++m)
    sampled.insert(std::stoi((*m)[1]));
  ASSERT_FALSE(sampled.empty()) << samples.output;
  for (int step : sampled) {
    const std::string again = recompute_step(run, step, d.dir + "/check" + std::to_string(step));
    recomputed.insert(recomputed.end(), {"--recomputed", "east=" + again + "/work/cluster0.jsonl", "--recomputed",
                                         "west=" + again + "/work/cluster1.jsonl"});
  }
  std::vector<std::string> checked = {"--samples", "1"};
  checked.insert(checked.end(), recomputed.begin(), recomputed.end());
  auto matched = spot(ledger, checked);
  EXPECT_EQ(matched.exit_code(), 0) << matched.output;
  EXPECT_TRUE(contains(matched.output, "2 recomputed (2 matched), 0 with a committed digest not recomputed")) << matched.output;

  // A cluster whose digests are not of the gradients it was given (here: made up) is flagged on the re-run step.
  const std::string lazy = d.dir + "/lazy", ledger2 = d.dir + "/ledger2.jsonl";
  fs::create_directories(lazy + "/work");
  fs::copy(run + "/config.toml", lazy + "/config.toml");
  std::vector<std::string> made_up;
  for (auto r : logs[1]) {
    r.digest = std::string(r.digest.rbegin(), r.digest.rend());
    made_up.push_back(crosstrain::train::work_record_json(r));
  }
  write_lines(lazy + "/work/cluster1.jsonl", made_up);
  auto lazy_claim = ct({"ledger", "claim", ledger2, "--run-dir", lazy, "--cluster", "west", "--cluster-index", "1",
                        "--key", d.dir + "/keys/west.key", "--job", "gpt"});
  ASSERT_EQ(lazy_claim.exit_code(), 0) << lazy_claim.output;
  checked[1] = "6";  // every step sampled: the re-run ones are compared
  auto mismatch = spot(ledger2, checked);
  EXPECT_EQ(mismatch.exit_code(), 3) << mismatch.output;
  EXPECT_TRUE(contains(mismatch.output, "differs from the recomputed")) << mismatch.output;
  EXPECT_TRUE(contains(mismatch.output, "FLAG cluster west seq 1: step " + std::to_string(*sampled.begin())))
      << mismatch.output;

  // (c) A third key claims steps the two clusters already account for in full, and 4x a step's tokens for steps
  // of its own, without digests: flagged, exit 3; the honest clusters are not.
  const std::string mallory_key = d.dir + "/keys/mallory.key";
  auto fake = ct({"ledger", "append", ledger, "--cluster", "mallory", "--key", mallory_key, "--job", "gpt",
                  "--first-step", "1", "--steps", "6", "--tokens", "768", "--flops", std::to_string(768 * per_token),
                  "--bytes", "0", "--keys", keys});
  ASSERT_EQ(fake.exit_code(), 0) << fake.output;
  auto inflated = ct({"ledger", "append", ledger, "--cluster", "mallory", "--key", mallory_key, "--job", "gpt",
                      "--first-step", "7", "--steps", "2", "--tokens", "2048", "--flops", "1e15", "--bytes", "0",
                      "--keys", keys});
  ASSERT_EQ(inflated.exit_code(), 0) << inflated.output;
  auto caught = spot(ledger, {"--samples", "3"});
  EXPECT_EQ(caught.exit_code(), 3) << caught.output;
  EXPECT_TRUE(contains(caught.output, "FLAG cluster mallory seq 3: claims 128 tokens a step for steps 1-6")) << caught.output;
  EXPECT_TRUE(contains(caught.output, "FLAG cluster mallory seq 4: claims 2048 tokens for 2 steps")) << caught.output;
  EXPECT_TRUE(contains(caught.output, "FLAG cluster mallory seq 4: claims 1e+15 FLOPs")) << caught.output;
  EXPECT_TRUE(contains(caught.output, "committed no gradient digest")) << caught.output;
  EXPECT_FALSE(contains(caught.output, "FLAG cluster east")) << caught.output;
  EXPECT_FALSE(contains(caught.output, "FLAG cluster west")) << caught.output;

  // (d) A tampered line: verify and spot-check refuse the ledger, naming the line.
  auto lines = read_lines(ledger);
  lines[0] = std::regex_replace(lines[0], std::regex("\"tokens\":768,"), "\"tokens\":1768,");
  ASSERT_NE(lines[0], read_lines(ledger)[0]);
  write_lines(ledger, lines);
  auto bad_verify = ct({"ledger", "verify", ledger, "--keys", keys});
  EXPECT_EQ(bad_verify.exit_code(), 1) << bad_verify.output;
  EXPECT_TRUE(contains(bad_verify.output, "line 1: hash does not match")) << bad_verify.output;
  auto bad_spot = spot(ledger, {"--samples", "3"});
  EXPECT_EQ(bad_spot.exit_code(), 1) << bad_spot.output;
  EXPECT_TRUE(contains(bad_spot.output, "does not verify, so its claims are not checked: line 1")) << bad_spot.output;
}

// A claim run while training goes on takes what the log holds; the next one takes only the steps after it.
TEST(LedgerClaims, ClaimsFollowAGrowingLog) {
  Dir d("ct_ledger_claims_grow");
  ASSERT_EQ(ct({"ledger", "keygen", "--cluster", "east", "--out", d.dir + "/keys"}).exit_code(), 0);
  const std::string log = d.dir + "/run/work/cluster3.jsonl", ledger = d.dir + "/ledger.jsonl";
  fs::create_directories(d.dir + "/run/work");
  std::vector<std::string> lines;
  for (int s = 1; s <= 5; ++s) {
    crosstrain::train::WorkRecord r{s, 100, 10, std::string(64, "0123456789"[s]), 1.8e9 + s};
    lines.push_back(crosstrain::train::work_record_json(r));
  }
  auto claim = [&] {
    return ct({"ledger", "claim", ledger, "--run-dir", d.dir + "/run", "--cluster", "east", "--cluster-index", "3",
               "--key", d.dir + "/keys/east.key", "--job", "j", "--flops-per-token", "6"});
  };
  // Three steps and half of the fourth line (being written): steps 1-3.
  write_lines(log, {lines[0], lines[1], lines[2]});
  std::ofstream(log, std::ios::app) << lines[3].substr(0, 20);
  auto first = claim();
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  EXPECT_TRUE(contains(first.output, "claimed steps 1-3 of job j for east: 300 tokens, 1800 FLOPs")) << first.output;
  write_lines(log, lines);
  auto second = claim();
  ASSERT_EQ(second.exit_code(), 0) << second.output;
  EXPECT_TRUE(contains(second.output, "claimed steps 4-5 of job j for east: 200 tokens")) << second.output;
  EXPECT_TRUE(contains(claim().output, "nothing to claim")) << "idempotent";
  const auto entries = read_lines(ledger);
  ASSERT_EQ(entries.size(), 2u);
  const auto e = nlohmann::json::parse(entries[1]);
  EXPECT_EQ(e["first_step"], 4);
  EXPECT_EQ(e["steps"], 2);
  EXPECT_EQ(e["bytes"], 20);
  EXPECT_EQ(e["interval_start"], 1800000004);
  EXPECT_EQ(e["interval_end"], 1800000005);
  // Another cluster's key is refused.
  ASSERT_EQ(ct({"ledger", "keygen", "--cluster", "west", "--out", d.dir + "/keys"}).exit_code(), 0);
  auto wrong = ct({"ledger", "claim", ledger, "--run-dir", d.dir + "/run", "--cluster", "east", "--cluster-index",
                   "3", "--key", d.dir + "/keys/west.key", "--job", "j", "--flops-per-token", "6"});
  EXPECT_EQ(wrong.exit_code(), 2) << wrong.output;
  EXPECT_TRUE(contains(wrong.output, "is cluster 'west''s key")) << wrong.output;
}

// The work log's digest is the ledger's digest of the same bytes: each gradient as fp32, in parameter order.
TEST(LedgerClaims, GradientDigestIsTheLedgerDigestOfTheFp32Bytes) {
  at::Tensor a = at::randn({3, 4}), b = at::randn({5}, at::kBFloat16), frozen = at::randn({2});
  a.mutable_grad() = at::randn({4, 3}).t();  // not contiguous
  b.mutable_grad() = at::randn({5}).to(at::kBFloat16);
  std::vector<float> bytes;
  for (const at::Tensor& g : {a.grad(), b.grad()}) {
    at::Tensor f = g.to(at::kFloat).contiguous();
    bytes.insert(bytes.end(), f.data_ptr<float>(), f.data_ptr<float>() + f.numel());
  }
  const std::string expected = ledger_digest(bytes.data(), bytes.size() * sizeof(float));
  EXPECT_EQ(crosstrain::train::gradient_digest({a, frozen, b}), expected);
  EXPECT_NE(crosstrain::train::gradient_digest({b, a}), expected) << "order matters";
}

TEST(LedgerClaims, WorkLogReaderKeepsTheLastLineOfAStepAndRefusesGarbage) {
  Dir d("ct_ledger_worklog");
  const std::string path = d.dir + "/w.jsonl";
  using crosstrain::train::WorkRecord;
  write_lines(path, {crosstrain::train::work_record_json(WorkRecord{2, 1, 0, std::string(64, 'a'), 5}),
                     crosstrain::train::work_record_json(WorkRecord{1, 1, 0, std::string(64, 'b'), 6}),
                     crosstrain::train::work_record_json(WorkRecord{2, 7, 0, std::string(64, 'c'), 7})});
  const auto records = crosstrain::train::read_work_log(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].step, 1);
  EXPECT_EQ(records[1].tokens, 7) << "a resumed run repeats step 2: the last line wins";
  write_lines(path, {"{\"step\":1}"});
  EXPECT_THROW(crosstrain::train::read_work_log(path), crosstrain::Error);
  EXPECT_THROW(crosstrain::train::read_work_log(d.dir + "/none.jsonl"), crosstrain::UsageError);
}

// shared_steps: clusters split each step; their tokens for a step add up to at most the step's.
TEST(LedgerClaims, SharedStepsAllowSplitsAndFlagExcess) {
  auto entry = [](const std::string& cluster, int64_t seq, int64_t first, int64_t steps, int64_t tokens) {
    LedgerEntry e;
    e.seq = seq;
    e.cluster = cluster;
    e.job = "j";
    e.first_step = first;
    e.steps = steps;
    e.tokens = tokens;
    e.flops = 6.0 * static_cast<double>(tokens);
    for (int64_t s = first; s < first + steps; ++s) e.gradient_digests[s] = std::string(64, 'a');
    e.hash = std::string(64, static_cast<char>('0' + seq));
    return e;
  };
  SpotCheckOptions o;
  o.jobs["j"] = {100, 6.0, true};
  const auto none = [](const std::string&, int64_t) { return std::string(); };
  // East does 60 a step over 1-10, west 40 a step in two entries of other lengths: exactly full.
  std::vector<LedgerEntry> entries = {entry("east", 1, 1, 10, 600), entry("west", 2, 1, 4, 160),
                                      entry("west", 3, 5, 6, 240)};
  auto r = spot_check(entries, o, none);
  EXPECT_TRUE(r.flags.empty()) << r.flags.front().reason;
  // A third cluster's 10 a step over 8-12 overflows steps 8-10; west claiming step 5 again is a double claim.
  entries.push_back(entry("mallory", 4, 8, 5, 50));
  entries.push_back(entry("west", 5, 5, 1, 0));
  r = spot_check(entries, o, none);
  ASSERT_EQ(r.flags.size(), 2u);
  EXPECT_EQ(r.flags[0].cluster, "mallory");
  EXPECT_NE(r.flags[0].reason.find("that east (seq 1), west (seq 3) claimed for step 8"), std::string::npos)
      << r.flags[0].reason;
  EXPECT_EQ(r.flags[1].cluster, "west");
  EXPECT_NE(r.flags[1].reason.find("already claimed by cluster 'west' (seq 3)"), std::string::npos) << r.flags[1].reason;
  // One cluster claiming more than whole steps is flagged on its own, and exclusive steps flag the split.
  r = spot_check({entry("east", 1, 1, 2, 250)}, o, none);
  ASSERT_FALSE(r.flags.empty());
  EXPECT_NE(r.flags[0].reason.find("so at most 200"), std::string::npos) << r.flags[0].reason;
  o.jobs["j"].shared_steps = false;
  r = spot_check({entry("east", 1, 1, 10, 600), entry("west", 2, 1, 4, 160)}, o, none);
  EXPECT_EQ(r.flagged_clusters(), (std::vector<std::string>{"east", "west"}));
}

// The work log needs each step's whole local gradient: refused where there is none, with the reason.
TEST(LedgerClaims, WorkLogIsRefusedWithZeroStagesThatShardGradients) {
  Dir d("ct_ledger_worklog_config");
  const std::string path = d.dir + "/c.toml";
  std::ofstream(path) << "[run]\nwork_log = true\n";
  EXPECT_TRUE(crosstrain::train::load_config(path).run.work_log);
  EXPECT_FALSE(crosstrain::train::load_config(path, {"run.work_log=false"}).run.work_log);
  try {
    crosstrain::train::load_config(path, {"parallel.zero=2"});
    FAIL() << "parallel.zero = 2 with run.work_log was accepted";
  } catch (const crosstrain::UsageError& e) {
    EXPECT_TRUE(contains(e.what(), "run.work_log = true needs parallel.zero 0 or 1")) << e.what();
  }
  EXPECT_NO_THROW(crosstrain::train::load_config(path, {"parallel.zero=1"}));
}
