#pragma once

#include <string>
#include <vector>

namespace crosstrain::apps {

struct TrainCommand {
  std::string config_path;
  int nproc = 1;                      // ranks to start when not already launched
  std::vector<std::string> sets;      // section.key=value overrides
  bool resume = false;
  int max_restarts = -1;              // -1: elastic.max_restarts; N >= 0 sets it and turns elastic training on
};

// `crosstrain train`: validates the config, starts the ranks if needed, and trains. Returns the exit code.
int train_command(const TrainCommand& command, const std::vector<std::string>& relaunch_args);

}  // namespace crosstrain::apps
