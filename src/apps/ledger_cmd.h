// `crosstrain ledger keygen|append|verify|show|claim|spot-check`: the ledger of contributed compute
// (ledger/ledger.h, docs/ledger.md) from the command line. claim and spot-check: ledger_claim.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crosstrain::apps {

// The subcommands' CLI11 nodes and the values their options fill in (CLI11 keeps pointers: do not move it).
struct LedgerCli {
  CLI::App *keygen = nullptr, *append = nullptr, *verify = nullptr, *show = nullptr;
  CLI::App *claim = nullptr, *spot_check = nullptr;
  std::string ledger, cluster, out, key, keys, job, head;
  int64_t steps = 0, tokens = 0, bytes = 0;
  int64_t first_step = -1, start = -1, end = -1;  // -1: from the ledger and the clock
  double flops = 0;
  // claim: the run's folder and this cluster's index in it; FLOPs per token (0: from RUN_DIR/config.toml).
  std::string run_dir;
  int cluster_index = -1;  // claim: < 0 reads work/CLUSTER.jsonl
  std::string work_log;    // claim: reads work/NAME.jsonl
  double flops_per_token = 0;
  std::string ca_cert;     // claim to an https:// scheduler with a certificate of its own
  // spot-check
  int64_t tokens_per_step = 0;
  uint64_t seed = 0;
  int samples = 2;
  double tolerance = 0.05;
  bool exclusive_steps = false;
  bool list_samples = false;
  std::vector<std::string> recomputed;  // CLUSTER=WORKLOG, the checker's own re-run
  std::vector<std::string> digests;  // STEP=HEX
  bool selected() const;
};

void add_ledger_command(CLI::App& app, LedgerCli& cli);
// Runs the chosen subcommand. verify: 0 and a summary per cluster for a ledger that verifies; 1 and one line
// naming the first bad line otherwise.
int run_ledger_command(const LedgerCli& cli);

// ledger_claim.cpp. spot-check exits 0 when nothing is flagged, kSpotCheckFlagged when something is, 1 for a
// ledger that does not verify.
constexpr int kSpotCheckFlagged = 3;
void add_claim_and_spot_check(CLI::App& ledger_cmd, LedgerCli& cli);
int run_claim(const LedgerCli& cli);
int run_spot_check(const LedgerCli& cli);

}  // namespace crosstrain::apps
