// Runs a shell command for the planner's CLI tests: its stdout and stderr together, and its wait status.
#pragma once

#include <cstdio>
#include <string>

namespace crosstrain::planner::testing_support {

inline std::string run_command(const std::string& command, int* status) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  char buffer[4096];
  while (p && fgets(buffer, sizeof buffer, p)) out += buffer;
  *status = p ? pclose(p) : -1;
  return out;
}

}  // namespace crosstrain::planner::testing_support
