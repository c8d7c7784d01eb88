// The one interface every byte of crosstrain travels through.
//
// Every operation is asynchronous: it starts the transfer and returns a Work handle; wait() blocks until the
// result is in place or the timeout passes, and throws CommError naming rank, operation, group, peer and cause.
// Buffers that hold one slice per rank (gather, all-gather, scatter, reduce-scatter, all-to-all) are single
// contiguous tensors whose numel is group size times the per-rank numel; slice i belongs to rank i.
// Input buffers must stay untouched, and output buffers unread, until wait() returns.
//
// All members of a group must issue the same collectives in the same order (as with NCCL and Gloo).
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::comm {

enum class ReduceOp { Sum, Avg, Min, Max, Product };
const char* to_string(ReduceOp op);
// Parses "sum", "avg", "min", "max", "prod"/"product"; throws UsageError otherwise.
ReduceOp parse_reduce_op(const std::string& name);

using Millis = std::chrono::milliseconds;

// A started operation. wait() returns once the result is in place; it throws CommError on failure or timeout.
// A Work refers to its communicator: wait for it before the communicator is destroyed.
class Work {
 public:
  explicit Work(Millis default_timeout) : default_timeout_(default_timeout) {}
  virtual ~Work() = default;
  void wait() { wait(default_timeout_); }
  virtual void wait(Millis timeout) = 0;
  // True once the operation finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
  // Like wait(timeout), but returns false as soon as `give_up()` returns true (checked every 20 ms or so) and
  // true once the operation is done (its error thrown as wait() throws it). Works that cannot sleep until either
  // happens return std::nullopt at once without waiting: the caller must find another way (elastic/abortable.h).
  virtual std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) {
    return std::nullopt;
  }

 private:
  Millis default_timeout_;
};
using WorkPtr = std::shared_ptr<Work>;

// A Work that is already done (operations with nothing to move, buffered sends).
WorkPtr completed_work();

// Waits for every handle in order (each with the default timeout).
void wait_all(const std::vector<WorkPtr>& works);

class Communicator {
 public:
  virtual ~Communicator() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  const std::string& backend() const { return backend_; }
  Millis timeout() const { return timeout_; }
  // Training step reported in error messages (set by the trainer at the start of a step).
  // Wrappers (shared memory, algorithms) pass it on to the communicator they wrap.
  virtual void set_step(int64_t step) { step_ = step; }

  // --- collectives ------------------------------------------------------------------------------------
  virtual WorkPtr broadcast(at::Tensor& tensor, int root) = 0;
  // Result lands in `tensor` on root only; other ranks' buffers are left unspecified.
  virtual WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op) = 0;
  virtual WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  // `output` (size * input.numel()) is only used on root.
  virtual WorkPtr gather(const at::Tensor& input, at::Tensor& output, int root) = 0;
  virtual WorkPtr all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  // `input` (size * output.numel()) is only used on root.
  virtual WorkPtr scatter(const at::Tensor& input, at::Tensor& output, int root) = 0;
  virtual WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  virtual WorkPtr all_to_all(const at::Tensor& input, at::Tensor& output) = 0;
  virtual WorkPtr barrier() = 0;

  // --- point to point ---------------------------------------------------------------------------------
  // Messages between the same pair with the same tag arrive in the order they were sent.
  virtual WorkPtr send(const at::Tensor& tensor, int dst, int tag) = 0;
  virtual WorkPtr recv(at::Tensor& tensor, int src, int tag) = 0;

  // --- groups -----------------------------------------------------------------------------------------
  // Collective over this group: every member calls it with the same list (ranks of this group, in the
  // order that defines the new ranks). Members get the sub-group; the others get nullptr.
  virtual std::unique_ptr<Communicator> split(const std::vector<int>& ranks) = 0;

 protected:
  Communicator(std::string backend, std::string name, int rank, int size, Millis timeout)
      : backend_(std::move(backend)), name_(std::move(name)), rank_(rank), size_(size), timeout_(timeout) {}

  CommContext context(const std::string& op, int peer = -1) const;
  [[noreturn]] void fail(const std::string& op, const std::string& cause, int peer = -1) const;

  // Argument checks shared by every back end; each throws CommError naming the operation.
  void check_tensor(const std::string& op, const at::Tensor& t, const char* what) const;
  void check_root(const std::string& op, int root) const;
  void check_peer(const std::string& op, int peer) const;
  void check_same_dtype(const std::string& op, const at::Tensor& a, const at::Tensor& b) const;
  // `many` must hold exactly size() times as many elements as `one`.
  void check_sliced(const std::string& op, const at::Tensor& one, const at::Tensor& many) const;
  void check_equal_numel(const std::string& op, const at::Tensor& a, const at::Tensor& b) const;
  // All-to-all: same dtype and size in and out, split into size() equal slices.
  void check_all_to_all(const at::Tensor& input, const at::Tensor& output) const;
  void check_split_ranks(const std::vector<int>& ranks) const;
  // Name for the next sub-group; advances the per-communicator split counter.
  std::string next_split_name();

 private:
  std::string backend_;
  std::string name_;
  int rank_;
  int size_;
  Millis timeout_;
  std::optional<int64_t> step_;
  int splits_ = 0;
};

// Collective: the largest `value` any member passes (benchmarks report the slowest rank's time).
double max_over_ranks(Communicator& c, double value);

}  // namespace crosstrain::comm
