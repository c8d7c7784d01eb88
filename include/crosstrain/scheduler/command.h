// Runs an external command (Slurm's sbatch, squeue, scancel, scontrol) with extra environment variables and a
// deadline: its output is captured, and it is killed when the deadline passes. Never waits forever.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace crosstrain::scheduler {

struct CommandResult {
  int exit_code = -1;       // the exit status, 128 + signal, or -1 when it could not start
  bool timed_out = false;   // killed at the deadline
  std::string output;       // stdout and stderr, interleaved
  bool ok() const { return exit_code == 0 && !timed_out; }
};

CommandResult run_command(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds deadline);

// "sbatch --parsable ..." as one line for messages.
std::string command_line(const std::vector<std::string>& argv);

}  // namespace crosstrain::scheduler
