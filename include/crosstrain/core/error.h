// Errors that carry context: which rank, which operation, which peer, which step.
// Library code throws these; the program boundary (apps/) prints what() and exits non-zero.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

namespace crosstrain {

// Base of every error crosstrain throws on purpose.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Bad user input: command line, config, data file. The message says how to fix it.
class UsageError : public Error {
 public:
  using Error::Error;
};

// Where a communication failure happened. Fields left unset are omitted from the message.
struct CommContext {
  int rank = -1;                 // rank in the group
  std::string op;                // "allreduce", "recv", "rendezvous", ...
  std::string group;             // group name, e.g. "world" or "world/split0"
  int group_size = 0;
  int peer = -1;                 // peer rank in the group, when known
  // A peer this failure is evidence against (a message from it did not authenticate), as its rank in the job's
  // world group (the group that was sealed first), whichever sub-group saw it; -1: nobody. Elastic training
  // excludes that peer instead of treating the failure as the reporting rank's own.
  int accused = -1;
  std::optional<int64_t> step;   // training step, when known
  std::optional<std::chrono::milliseconds> timeout;
};

// A collective, point-to-point or rendezvous operation failed or timed out.
class CommError : public Error {
 public:
  CommError(CommContext context, const std::string& cause, bool timed_out = false);
  const CommContext& context() const { return context_; }
  const std::string& cause() const { return cause_; }
  bool timed_out() const { return timed_out_; }

 private:
  CommContext context_;
  std::string cause_;
  bool timed_out_;
};

// Formats "[rank 0] allreduce on group 'world' (2 ranks), peer 1, step 12: <cause> (timeout 30 s)".
std::string describe(const CommContext& context, const std::string& cause);

}  // namespace crosstrain
