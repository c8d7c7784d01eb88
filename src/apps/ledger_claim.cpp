// `crosstrain ledger claim` (a cluster signs what its work log says it did, once per step) and
// `crosstrain ledger spot-check` (the chain, then the claims against the job's figures). docs/ledger.md.
#include <CLI/CLI.hpp>
#include <httplib.h>
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/api_auth.h"
#include "crosstrain/ledger/ledger.h"
#include "crosstrain/train/config.h"
#include "crosstrain/ledger/work_log.h"
#include "ledger_cmd.h"

namespace crosstrain::apps {
namespace fs = std::filesystem;
using namespace crosstrain::scheduler;

namespace {

void add_claim(CLI::App& cmd, LedgerCli& cli) {
  auto* c = cli.claim = cmd.add_subcommand(
      "claim", "sign and append the steps of RUN_DIR/work/cluster<K>.jsonl (run.work_log = true) that this cluster "
               "has not claimed yet for the job: one entry per run of consecutive steps; nothing new: no entry");
  c->add_option("ledger", cli.ledger,
                "ledger file (JSONL; created if missing), or the URL of the scheduler that keeps it "
                "(http[s]://HOST:PORT: a cluster that does not share its disk; requests signed with --key)")
      ->required();
  c->add_option("--ca-cert", cli.ca_cert, "with an https:// ledger: the scheduler's certificate (PEM) to trust");
  c->add_option("--run-dir", cli.run_dir, "the training run's folder (run.dir), which holds work/")->required();
  c->add_option("--cluster", cli.cluster, "this cluster's name in the ledger (the key's)")->required();
  c->add_option("--cluster-index", cli.cluster_index,
                "this cluster's index K in the run (CROSSTRAIN_CLUSTER): reads work/cluster<K>.jsonl")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--work-log", cli.work_log, "reads work/NAME.jsonl instead (CROSSTRAIN_WORK_LOG_NAME of the run)");
  c->add_option("--key", cli.key, "the cluster's secret key file (ledger keygen)")->required();
  c->add_option("--job", cli.job, "job the work was for")->required();
  c->add_option("--flops-per-token", cli.flops_per_token,
                "FLOPs = tokens x this (default: the model's, 6 N + attention, from RUN_DIR/config.toml)")
      ->check(CLI::PositiveNumber);
  c->add_option("--keys", cli.keys, "keys file: also check the other clusters' signatures before appending");
}

void add_spot_check(CLI::App& cmd, LedgerCli& cli) {
  auto* s = cli.spot_check = cmd.add_subcommand(
      "spot-check",
      "verify the chain, then check a job's claims: tokens against tokens a step (clusters share each step unless "
      "--exclusive-steps), FLOPs against tokens x FLOPs per token, steps claimed twice, and a committed gradient "
      "digest for each sampled step. This command runs no training: a sampled digest is compared only with a "
      "--recomputed work log, which YOU produce by re-running the sampled steps (--list-samples) from the run's "
      "checkpoints; without one it is checked to exist, not to be right (docs/ledger.md). Exit 0: nothing "
      "flagged; 3: flags printed; 1: the ledger does not verify");
  s->add_option("ledger", cli.ledger, "ledger file")->required();
  s->add_option("--keys", cli.keys, "keys file: {\"CLUSTER\": \"HEX public key\", ...}")->required();
  s->add_option("--job", cli.job, "the job whose entries are checked")->required();
  s->add_option("--tokens-per-step", cli.tokens_per_step, "the job's tokens a step (global batch x block size)")
      ->required()
      ->check(CLI::PositiveNumber);
  s->add_option("--flops-per-token", cli.flops_per_token, "the job's FLOPs per token")
      ->required()
      ->check(CLI::PositiveNumber);
  s->add_option("--seed", cli.seed, "with each entry's hash, fixes the sampled steps (anyone can redraw them)");
  s->add_option("--samples", cli.samples, "steps sampled from each entry")->check(CLI::Range(1, 1000000));
  s->add_option("--tolerance", cli.tolerance, "relative tolerance for tokens and FLOPs")->check(CLI::Range(0.0, 1.0));
  s->add_flag("--list-samples", cli.list_samples,
              "only print the steps sampled from each entry (after verifying the chain): the steps to re-run");
  s->add_option("--recomputed", cli.recomputed,
                "CLUSTER=WORKLOG: a work log (run.work_log) the checker wrote itself by re-running sampled steps "
                "(crosstrain train --resume from the checkpoint before the step, same layout and clusters); its "
                "digests are the recomputation of CLUSTER's share (repeatable). Never the contributor's own log");
  s->add_flag("--exclusive-steps", cli.exclusive_steps,
              "each step is computed by one cluster alone (tokens = steps x tokens a step; a step claimed by two "
              "clusters is flagged); default: clusters share each step, their tokens for it add up to at most one "
              "step's");
}

// One `ledger claim` at a time per ledger: between reading what is claimed and appending, no other claim of the
// same cluster may append the same steps. (append_ledger's own lock covers only the append.)
class ClaimLock {
 public:
  explicit ClaimLock(const std::string& ledger) : path_(ledger + ".claim-lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) throw Error("ledger claim: cannot open the lock file '" + path_ + "': " + std::strerror(errno));
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (std::chrono::steady_clock::now() > give_up) {
        ::close(fd_);
        throw Error("ledger claim: another claim has held '" + path_ + "' for 60 s; is one stuck? (nothing was "
                    "claimed; try again)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  ~ClaimLock() { ::close(fd_); }
  ClaimLock(const ClaimLock&) = delete;
  ClaimLock& operator=(const ClaimLock&) = delete;

 private:
  std::string path_;
  int fd_ = -1;
};

double claim_flops_per_token(const LedgerCli& cli) {
  if (cli.flops_per_token > 0) return cli.flops_per_token;
  const std::string config = (fs::path(cli.run_dir) / "config.toml").string();
  if (!fs::exists(config))
    throw UsageError("ledger claim: no '" + config + "' to take the model's FLOPs per token from; give "
                     "--flops-per-token");
  return train::load_config(config).model.flops_per_token();
}

// The job's steps this cluster has claimed: first step -> last step.
std::map<int64_t, int64_t> claimed_ranges(const std::vector<LedgerEntry>& entries, const LedgerCli& cli) {
  std::map<int64_t, int64_t> out;
  for (const auto& e : entries)
    if (e.job == cli.job && e.cluster == cli.cluster && e.steps > 0) out[e.first_step] = e.first_step + e.steps - 1;
  return out;
}

bool is_claimed(const std::map<int64_t, int64_t>& ranges, int64_t step) {
  auto it = ranges.upper_bound(step);
  if (it == ranges.begin()) return false;
  return std::prev(it)->second >= step;
}

// Runs of consecutive unclaimed steps, each one entry.
std::vector<std::vector<train::WorkRecord>> unclaimed_runs(const std::vector<train::WorkRecord>& records,
                                                           const std::map<int64_t, int64_t>& claimed) {
  std::vector<std::vector<train::WorkRecord>> runs;
  for (const auto& r : records) {
    if (is_claimed(claimed, r.step)) continue;
    if (runs.empty() || runs.back().back().step + 1 != r.step) runs.emplace_back();
    runs.back().push_back(r);
  }
  return runs;
}

LedgerEntry entry_for(const std::vector<train::WorkRecord>& run, const LedgerCli& cli, double flops_per_token) {
  LedgerEntry e;
  e.cluster = cli.cluster;
  e.job = cli.job;
  e.first_step = run.front().step;
  e.steps = static_cast<int64_t>(run.size());
  for (const auto& r : run) {
    e.tokens += r.tokens;
    e.bytes += r.bytes;
    e.gradient_digests[r.step] = r.digest;
  }
  e.flops = static_cast<double>(e.tokens) * flops_per_token;
  e.interval_start = static_cast<int64_t>(std::floor(run.front().time));
  e.interval_end = std::max(e.interval_start, static_cast<int64_t>(std::ceil(run.back().time)));
  return e;
}

bool is_url(const std::string& ledger) {
  return ledger.rfind("http://", 0) == 0 || ledger.rfind("https://", 0) == 0;
}

// The ledger a scheduler keeps (GET and POST /api/ledger), each request signed with the cluster's key.
class RemoteLedger {
 public:
  RemoteLedger(const LedgerCli& cli, const LedgerKey& key) : url_(cli.ledger), key_(key), client_(cli.ledger) {
    if (url_.find('/', url_.find("//") + 2) != std::string::npos)
      throw UsageError("ledger claim: '" + url_ + "' is not http[s]://HOST:PORT (the scheduler's address, no path)");
    client_.set_connection_timeout(10, 0);
    client_.set_read_timeout(30, 0);
    if (!cli.ca_cert.empty()) client_.set_ca_cert_path(cli.ca_cert.c_str());
    client_.enable_server_certificate_verification(true);
  }
  // The chain, at most kMaxLedgerBytes: what a peer sends is read within a bound.
  std::string text() {
    std::string body;
    bool too_big = false;
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    const httplib::Headers headers{
        {kSignatureHeader, sign_request(key_.cluster, key_.secret_key.data(), "GET", "/api/ledger", "", now)}};
    const httplib::Result r = client_.Get("/api/ledger", headers, [&](const char* data, size_t size) {
      too_big = body.size() + size > kMaxLedgerBytes;
      if (!too_big) body.append(data, size);
      return !too_big;
    });
    if (too_big)
      throw Error("ledger claim: " + url_ + " sent a ledger of more than " + std::to_string(kMaxLedgerBytes >> 20) +
                  " MiB; nothing was claimed");
    checked(r, 200, 0, body);
    return body;
  }
  // 201: appended; 409: the chain moved on. Anything else throws.
  int append(const std::string& line) { return checked(send(line), 201, 409).status; }

 private:
  httplib::Result send(const std::string& body) {
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    const httplib::Headers headers{
        {kSignatureHeader, sign_request(key_.cluster, key_.secret_key.data(), "POST", "/api/ledger", body, now)}};
    return client_.Post("/api/ledger", headers, body, "application/json");
  }
  const httplib::Response& checked(const httplib::Result& r, int ok, int also = 0, const std::string& received = "") {
    if (!r)
      throw Error("ledger claim: no scheduler answers at " + url_ + " (" + httplib::to_string(r.error()) +
                  "); nothing was claimed");
    if (r->status != ok && r->status != also)
      throw Error("ledger claim: " + url_ + " answered " + std::to_string(r->status) + ": " +
                  (received.empty() ? r->body : received).substr(0, 400));
    return *r;
  }
  static constexpr size_t kMaxLedgerBytes = size_t{1} << 30;
  std::string url_;
  const LedgerKey& key_;
  httplib::Client client_;
};

void print_claimed(const LedgerEntry& done, double flops_per_token) {
  std::printf("claimed steps %lld-%lld of job %s for %s: %lld tokens, %.6g FLOPs (%.6g a token), %lld bytes, "
              "%zu digests; seq %lld, hash %s\n",
              static_cast<long long>(done.first_step), static_cast<long long>(done.first_step + done.steps - 1),
              done.job.c_str(), done.cluster.c_str(), static_cast<long long>(done.tokens), done.flops, flops_per_token,
              static_cast<long long>(done.bytes), done.gradient_digests.size(), static_cast<long long>(done.seq),
              done.hash.c_str());
}

// Over the network: read the chain, seal the next unclaimed run after its head, send it; read again after each
// (another cluster may have appended meanwhile: 409, and this one seals again after the new head).
int claim_remote(const LedgerCli& cli, const LedgerKey& key, const PublicKeys& keys,
                 const std::vector<train::WorkRecord>& records, double flops_per_token, const std::string& log) {
  RemoteLedger ledger(cli, key);
  int conflicts = 0, claimed = 0;
  for (;;) {
    LedgerVerifyOptions options;
    options.require_known_clusters = false;
    const LedgerVerifyReport chain = verify_ledger_text(ledger.text(), keys, options);
    if (!chain.ok)
      throw Error("ledger claim: the ledger at " + cli.ledger + " does not verify (" + chain.message() +
                  "); nothing was claimed");
    const auto runs = unclaimed_runs(records, claimed_ranges(chain.parsed, cli));
    if (runs.empty()) break;
    LedgerEntry entry = entry_for(runs.front(), cli, flops_per_token);
    seal_entry(entry, chain.entries + 1, chain.head_hash, key);
    if (ledger.append(entry_line(entry)) == 201) {
      print_claimed(entry, flops_per_token);
      ++claimed;
    } else if (++conflicts > 50) {
      throw Error("ledger claim: the ledger at " + cli.ledger + " moved on 50 times while this claim was sealed; "
                  "try again");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * conflicts));
    }
  }
  if (claimed == 0)
    std::printf("nothing to claim: %s holds %zu steps, all already claimed by %s for job %s\n", log.c_str(),
                records.size(), cli.cluster.c_str(), cli.job.c_str());
  return 0;
}

// --recomputed CLUSTER=WORKLOG: cluster -> step -> the recomputed digest.
std::map<std::string, std::map<int64_t, std::string>> read_recomputed(const std::vector<std::string>& items) {
  std::map<std::string, std::map<int64_t, std::string>> out;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw UsageError("--recomputed '" + item + "' must be CLUSTER=WORKLOG, e.g. --recomputed east=check/work/cluster0.jsonl");
    for (const auto& r : train::read_work_log(item.substr(eq + 1))) out[item.substr(0, eq)][r.step] = r.digest;
  }
  return out;
}

int list_samples(const std::vector<LedgerEntry>& entries, const LedgerCli& cli) {
  for (const auto& e : entries) {
    std::string steps;
    for (int64_t s : sample_steps(e, cli.seed, cli.samples)) steps += " " + std::to_string(s);
    std::printf("sample cluster %s seq %lld (steps %lld-%lld):%s\n", e.cluster.c_str(), static_cast<long long>(e.seq),
                static_cast<long long>(e.first_step), static_cast<long long>(e.first_step + e.steps - 1),
                steps.c_str());
  }
  return 0;
}

}  // namespace

void add_claim_and_spot_check(CLI::App& ledger_cmd, LedgerCli& cli) {
  add_claim(ledger_cmd, cli);
  add_spot_check(ledger_cmd, cli);
}

int run_claim(const LedgerCli& cli) {
  const LedgerKey key = read_ledger_key(cli.key);
  if (key.cluster != cli.cluster)
    throw UsageError("ledger claim: --key '" + cli.key + "' is cluster '" + key.cluster + "''s key, not --cluster '" +
                     cli.cluster + "''s");
  const PublicKeys keys = cli.keys.empty() ? PublicKeys{} : read_public_keys(cli.keys);
  const std::string log = !cli.work_log.empty()    ? train::work_log_path(cli.run_dir, 0, cli.work_log)
                          : cli.cluster_index >= 0 ? train::work_log_path(cli.run_dir, cli.cluster_index)
                                                   : train::work_log_path(cli.run_dir, 0, cli.cluster);
  const std::vector<train::WorkRecord> records = train::read_work_log(log);
  const double flops_per_token = claim_flops_per_token(cli);
  if (is_url(cli.ledger)) return claim_remote(cli, key, keys, records, flops_per_token, log);
  ClaimLock lock(cli.ledger);
  LedgerVerifyReport chain;
  if (fs::exists(cli.ledger)) {
    LedgerVerifyOptions options;
    options.require_known_clusters = false;  // links and hashes here; append_ledger checks the signatures it can
    chain = verify_ledger(cli.ledger, {}, options);
    if (!chain.ok)
      throw Error("ledger claim: " + cli.ledger + " does not verify (" + chain.message() + "); nothing was claimed");
  }
  const auto runs = unclaimed_runs(records, claimed_ranges(chain.parsed, cli));
  if (runs.empty()) {
    std::printf("nothing to claim: %s holds %zu steps, all already claimed by %s for job %s\n", log.c_str(),
                records.size(), cli.cluster.c_str(), cli.job.c_str());
    return 0;
  }
  for (const auto& run : runs) {
    print_claimed(append_ledger(cli.ledger, entry_for(run, cli, flops_per_token), key, keys), flops_per_token);
  }
  return 0;
}

int run_spot_check(const LedgerCli& cli) {
  const LedgerVerifyReport chain = verify_ledger(cli.ledger, read_public_keys(cli.keys));
  if (!chain.ok) {
    std::cerr << "crosstrain: ledger " + cli.ledger + " does not verify, so its claims are not checked: " +
                     chain.message() + "\n" << std::flush;
    return 1;
  }
  std::vector<LedgerEntry> entries;
  std::set<std::string> jobs;
  for (const auto& e : chain.parsed) {
    jobs.insert(e.job);
    if (e.job == cli.job) entries.push_back(e);
  }
  if (entries.empty()) {
    std::string names;
    for (const auto& j : jobs) names += (names.empty() ? "" : ", ") + j;
    throw UsageError("ledger spot-check: " + cli.ledger + " has no entries of job '" + cli.job + "' (jobs: " +
                     (names.empty() ? "none" : names) + ")");
  }
  if (cli.list_samples) return list_samples(entries, cli);
  SpotCheckOptions options;
  options.seed = cli.seed;
  options.samples_per_entry = cli.samples;
  options.tolerance = cli.tolerance;
  options.jobs[cli.job] = {cli.tokens_per_step, cli.flops_per_token, !cli.exclusive_steps};
  // Only the checker's own re-run counts as a recomputation; a step it did not re-run counts as skipped.
  const auto recomputed = read_recomputed(cli.recomputed);
  const SpotCheckReport report =
      spot_check_shares(entries, options, [&](const std::string& cluster, const std::string&, int64_t step) {
        const auto c = recomputed.find(cluster);
        if (c == recomputed.end()) return std::string();
        const auto s = c->second.find(step);
        return s == c->second.end() ? std::string() : s->second;
      });
  std::string flagged;
  for (const auto& c : report.flagged_clusters()) flagged += (flagged.empty() ? "clusters " : ", ") + c;
  for (const auto& f : report.flags)
    std::printf("FLAG cluster %s seq %lld: %s\n", f.cluster.c_str(), static_cast<long long>(f.seq), f.reason.c_str());
  std::printf("spot-check of job %s in %s: chain verified (%lld entries), %zu entries of the job checked, seed %llu; "
              "sampled steps: %lld recomputed (%lld matched), %lld with a committed digest not recomputed (no "
              "--recomputed log holds them); %zu flags%s\n",
              cli.job.c_str(), cli.ledger.c_str(), static_cast<long long>(chain.entries), entries.size(),
              static_cast<unsigned long long>(cli.seed), static_cast<long long>(report.steps_recomputed),
              static_cast<long long>(report.steps_matched), static_cast<long long>(report.steps_skipped),
              report.flags.size(), flagged.empty() ? "" : (": " + flagged).c_str());
  return report.flags.empty() ? 0 : kSpotCheckFlagged;
}

}  // namespace crosstrain::apps
