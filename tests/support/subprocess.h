// Running programs from tests: with an environment, a deadline, and their output captured.
#pragma once

#include <chrono>
#include <map>
#include <string>
#include <vector>

namespace crosstrain::testing {

struct ProcessResult {
  int status = 0;          // raw waitpid status
  bool timed_out = false;  // killed by us at the deadline
  std::string output;      // stdout and stderr, interleaved
  double seconds = 0;
  int exit_code() const;   // exit code, or 128 + signal
};

class Process {
 public:
  Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {});
  ~Process();
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  int pid() const { return pid_; }
  void signal(int sig);
  // Reads output until it contains `text` or the deadline passes; returns whether it appeared.
  bool wait_for_output(const std::string& text, std::chrono::milliseconds deadline);
  // Waits until exit or the deadline (then SIGKILL), collecting output.
  ProcessResult wait(std::chrono::milliseconds deadline);

 private:
  int pid_ = -1;
  int fd_ = -1;
  std::chrono::steady_clock::time_point start_;
  std::string output_;
};

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {},
                          std::chrono::milliseconds deadline = std::chrono::milliseconds(60000));

// `command` through /bin/sh -c: stdout and stderr together, killed with its process group at the deadline.
ProcessResult run_shell(const std::string& command,
                        std::chrono::milliseconds deadline = std::chrono::milliseconds(300000));

// A TCP port that was free a moment ago.
int free_port();

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// torchrun's variables for rank `rank` of `world` on 127.0.0.1:port (and CT_TIMEOUT_MS for the test workers);
// `launcher_hosts_store`: the store is hosted by someone else, not by rank 0.
std::map<std::string, std::string> launched_rank_env(int rank, int world, int port, int timeout_ms,
                                                     bool launcher_hosts_store);

}  // namespace crosstrain::testing
