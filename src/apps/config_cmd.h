// `crosstrain config [RECIPE] [--set KEY=VALUE ...] [--nproc N]`: the config a run would get, every key with what
// it takes and its default, and what follows from it. Nothing is trained.
#pragma once

#include <string>
#include <vector>

namespace crosstrain::apps {

struct ConfigCommand {
  std::string recipe;              // empty: the defaults
  std::vector<std::string> sets;   // overrides, as `crosstrain train --set`
  int nproc = 0;                   // > 0: also resolve for this many ranks and print the layout
  bool reference = false;          // print docs/config-reference.md (every key's defaults) instead
};

// Prints the resolved config as TOML (valid as a recipe) with a comment per key (help, type, default), after the
// notices; or, with `reference`, the Markdown reference of every key. Exit code 0; a bad key or value throws
// UsageError as `crosstrain train` would.
int config_command(const ConfigCommand& command);

}  // namespace crosstrain::apps
