// `crosstrain ledger keygen|append|verify|show`: the ledger of contributed compute (scheduler/ledger.h,
// docs/ledger.md) from the command line.
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
  std::string ledger, cluster, out, key, keys, job, head;
  int64_t steps = 0, tokens = 0, bytes = 0;
  int64_t first_step = -1, start = -1, end = -1;  // -1: from the ledger and the clock
  double flops = 0;
  std::vector<std::string> digests;  // STEP=HEX
  bool selected() const;
};

void add_ledger_command(CLI::App& app, LedgerCli& cli);
// Runs the chosen subcommand. verify: 0 and a summary per cluster for a ledger that verifies; 1 and one line
// naming the first bad line otherwise.
int run_ledger_command(const LedgerCli& cli);

}  // namespace crosstrain::apps
