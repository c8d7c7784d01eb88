#include "ledger_cmd.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "crosstrain/core/error.h"
#include "crosstrain/ledger/ledger.h"

namespace crosstrain::apps {
namespace fs = std::filesystem;
using namespace crosstrain::scheduler;

namespace {

void add_keygen(CLI::App& cmd, LedgerCli& cli) {
  cli.keygen = cmd.add_subcommand("keygen", "make a cluster's Ed25519 key: DIR/NAME.key (0600), DIR/NAME.pub, "
                                            "and NAME in DIR/keys.json");
  cli.keygen->add_option("--cluster", cli.cluster, "cluster name")->required();
  cli.keygen->add_option("--out", cli.out, "folder for the key files")->required();
}

void add_append(CLI::App& cmd, LedgerCli& cli) {
  auto* a = cli.append = cmd.add_subcommand("append", "sign and append what a cluster contributed in an interval");
  a->add_option("ledger", cli.ledger, "ledger file (JSONL; created if missing)")->required();
  a->add_option("--cluster", cli.cluster, "the contributing cluster (must be the key's)")->required();
  a->add_option("--key", cli.key, "the cluster's secret key file (ledger keygen)")->required();
  a->add_option("--job", cli.job, "job the work was for")->required();
  a->add_option("--steps", cli.steps, "training steps computed")->required()->check(CLI::NonNegativeNumber);
  a->add_option("--tokens", cli.tokens, "tokens processed")->required()->check(CLI::NonNegativeNumber);
  a->add_option("--flops", cli.flops, "floating-point operations (e.g. 6e15)")->required()->check(CLI::NonNegativeNumber);
  a->add_option("--bytes", cli.bytes, "bytes sent over the network")->required()->check(CLI::NonNegativeNumber);
  a->add_option("--first-step", cli.first_step, "first step of the range (default: the job's next unclaimed step)")
      ->check(CLI::NonNegativeNumber);
  a->add_option("--start", cli.start, "interval start, Unix seconds (default: the cluster's previous end, or now)");
  a->add_option("--end", cli.end, "interval end, Unix seconds (default: now)");
  a->add_option("--digest", cli.digests, "STEP=HEX: SHA-256 of that step's gradient bytes (repeatable; commit every "
                                         "step, spot checks sample them)");
  a->add_option("--keys", cli.keys, "keys file: also check the other clusters' signatures before appending");
}

void add_verify_and_show(CLI::App& cmd, LedgerCli& cli) {
  cli.verify = cmd.add_subcommand("verify", "check every link, hash and signature; totals per cluster");
  cli.verify->add_option("ledger", cli.ledger, "ledger file")->required();
  cli.verify->add_option("--keys", cli.keys, "keys file: {\"CLUSTER\": \"HEX public key\", ...}")->required();
  cli.verify->add_option("--head", cli.head, "hash the chain must contain (the last head you saw): catches a cut end");
  cli.show = cmd.add_subcommand("show", "list the entries (their signatures are checked by verify, not here)");
  cli.show->add_option("ledger", cli.ledger, "ledger file")->required();
}

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::map<int64_t, std::string> parse_digests(const std::vector<std::string>& items) {
  std::map<int64_t, std::string> out;
  for (const auto& item : items) {
    const auto eq = item.find('=');
    size_t used = 0;
    int64_t step = -1;
    try {
      step = std::stoll(item.substr(0, eq), &used);
    } catch (const std::exception&) {
    }
    if (eq == std::string::npos || used != eq || step < 0)
      throw UsageError("--digest '" + item + "' must be STEP=HEX, e.g. --digest 12=" + std::string(64, 'a'));
    out[step] = item.substr(eq + 1);
  }
  return out;
}

// The chain as it stands, for defaults (signatures are checked by append itself).
LedgerVerifyReport current_chain(const std::string& path) {
  if (!fs::exists(path)) return {};
  LedgerVerifyOptions options;
  options.require_known_clusters = false;
  return verify_ledger(path, {}, options);
}

int append(const LedgerCli& cli) {
  const LedgerKey key = read_ledger_key(cli.key);
  const PublicKeys keys = cli.keys.empty() ? PublicKeys{} : read_public_keys(cli.keys);
  LedgerEntry e;
  e.cluster = cli.cluster;
  e.job = cli.job;
  e.steps = cli.steps;
  e.tokens = cli.tokens;
  e.flops = cli.flops;
  e.bytes = cli.bytes;
  e.gradient_digests = parse_digests(cli.digests);
  const LedgerVerifyReport chain = current_chain(cli.ledger);
  int64_t next_step = 0, previous_end = -1;
  for (const auto& p : chain.parsed) {
    if (p.job != e.job) continue;
    next_step = std::max(next_step, p.first_step + p.steps);
    if (p.cluster == e.cluster) previous_end = p.interval_end;
  }
  e.first_step = cli.first_step >= 0 ? cli.first_step : next_step;
  e.interval_end = cli.end >= 0 ? cli.end : now_s();
  e.interval_start = cli.start >= 0 ? cli.start : (previous_end >= 0 ? std::min(previous_end, e.interval_end) : e.interval_end);
  const LedgerEntry done = append_ledger(cli.ledger, e, key, keys);
  std::printf("appended seq %lld to %s: cluster %s, job %s, steps %lld-%lld, hash %s\n",
              static_cast<long long>(done.seq), cli.ledger.c_str(), done.cluster.c_str(), done.job.c_str(),
              static_cast<long long>(done.first_step), static_cast<long long>(done.first_step + done.steps - 1),
              done.hash.c_str());
  return 0;
}

int verify(const LedgerCli& cli) {
  LedgerVerifyOptions options;
  options.expected_head = cli.head;
  const LedgerVerifyReport r = verify_ledger(cli.ledger, read_public_keys(cli.keys), options);
  if (!r.ok) {
    std::cerr << "crosstrain: ledger " + cli.ledger + " does not verify: " + r.message() + "\n" << std::flush;
    return 1;
  }
  std::printf("ledger %s: %lld entries, chain and signatures verified, head %s\n", cli.ledger.c_str(),
              static_cast<long long>(r.entries), r.head_hash.empty() ? "(empty)" : r.head_hash.c_str());
  std::printf("%-20s %8s %12s %16s %12s %14s\n", "cluster", "entries", "steps", "tokens", "FLOPs", "bytes");
  for (const auto& [name, t] : r.totals)
    std::printf("%-20s %8lld %12lld %16lld %12.4g %14lld\n", name.c_str(), static_cast<long long>(t.entries),
                static_cast<long long>(t.steps), static_cast<long long>(t.tokens), t.flops,
                static_cast<long long>(t.bytes));
  return 0;
}

int show(const LedgerCli& cli) {
  const LedgerVerifyReport r = current_chain(cli.ledger);
  std::printf("%6s %-16s %-16s %12s %8s %12s %12s %8s %s\n", "seq", "cluster", "job", "first_step", "steps", "tokens",
              "FLOPs", "digests", "hash");
  for (const auto& e : r.parsed)
    std::printf("%6lld %-16s %-16s %12lld %8lld %12lld %12.4g %8zu %.16s\n", static_cast<long long>(e.seq),
                e.cluster.c_str(), e.job.c_str(), static_cast<long long>(e.first_step), static_cast<long long>(e.steps),
                static_cast<long long>(e.tokens), e.flops, e.gradient_digests.size(), e.hash.c_str());
  if (!r.ok) {
    std::cerr << "crosstrain: ledger " + cli.ledger + ": entries after this are not shown: " + r.message() + "\n";
    return 1;
  }
  return 0;
}

}  // namespace

bool LedgerCli::selected() const { return *keygen || *append || *verify || *show || *claim || *spot_check; }

void add_ledger_command(CLI::App& app, LedgerCli& cli) {
  auto* cmd = app.add_subcommand("ledger", "the signed ledger of contributed compute (docs/ledger.md)");
  cmd->require_subcommand(1);
  add_keygen(*cmd, cli);
  add_append(*cmd, cli);
  add_verify_and_show(*cmd, cli);
  add_claim_and_spot_check(*cmd, cli);
}

int run_ledger_command(const LedgerCli& cli) {
  if (*cli.keygen) {
    const LedgerKey key = generate_ledger_key(cli.cluster);
    const std::string path = write_ledger_key(key, cli.out);
    std::string public_hex;
    std::ifstream(fs::path(cli.out) / (cli.cluster + ".pub")) >> public_hex;
    std::printf("wrote %s (secret, mode 0600), %s/%s.pub and %s/keys.json\ncluster %s public key %s\n", path.c_str(),
                cli.out.c_str(), cli.cluster.c_str(), cli.out.c_str(), cli.cluster.c_str(), public_hex.c_str());
    return 0;
  }
  if (*cli.append) return append(cli);
  if (*cli.verify) return verify(cli);
  if (*cli.claim) return run_claim(cli);
  if (*cli.spot_check) return run_spot_check(cli);
  return show(cli);
}

}  // namespace crosstrain::apps
