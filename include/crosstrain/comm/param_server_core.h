// The skeleton every parameter server of crosstrain shares: the dense one behind `ssp` and `async`
// (sync/param_server.h) and the sparse one behind DLRM's `ps` mode (recsys/sparse_param_server.h). They differ
// only in their payload (a flat shard of the parameters; rows of embedding tables) and what a request does to it.
//
// Every rank of the group is a server and a worker. The server side is one thread per other worker, each blocked
// on that worker's next request header (Gloo's receives cannot be polled); requests to the server of one's own
// rank are handled in place by the owner, without a message. This core owns:
//   - those threads and the wait for the next header (2 x timeout: a live worker sends at least every
//     sync.period steps, and a slow peer's own error should come first);
//   - the clock of every worker and the version (pushes applied), from which ssp's bound is checked;
//   - the goodbye at finish(), and the first failure of a server thread, rethrown by the worker on that rank
//     with the server's rank and the worker it served.
// The owner holds the payload, under mutex() like the clocks, and serves each request through `Serve`.
//
// Request header: int64 [header_words]; word 0 the request type (the owner's; kBye is the core's), word 1 the
// worker's clock; the rest is the owner's.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

class ParamServerCore {
 public:
  static constexpr int64_t kBye = -1;  // the request type of the goodbye; owners use positive types

  struct Clocks {
    int64_t version = 0;    // pushes this rank's server applied
    int64_t min_clock = 0;  // the slowest worker's clock
    int slowest = 0;        // its rank
  };
  // Serves one request of `worker` whose header arrived: receives the rest, applies it, replies. Runs on that
  // worker's server thread; an exception ends the thread and is rethrown by this rank's worker.
  using Serve = std::function<void(int worker, const at::Tensor& header)>;

  // `group`: a dedicated split (the owner's tags are its own). `name` says which server in errors ("sparse
  // parameter server"). `initial_clock`: every worker's clock at the start (a resumed run starts past 0).
  ParamServerCore(Communicator& group, Millis timeout, std::string name, int request_tag, int64_t header_words,
                  int64_t initial_clock = 0);
  // Stops and joins the server threads (each waits at most 2 x timeout for a worker that never said goodbye).
  ~ParamServerCore();
  ParamServerCore(const ParamServerCore&) = delete;
  ParamServerCore& operator=(const ParamServerCore&) = delete;

  // Starts the server threads; once, at the end of the owner's constructor (its payload must exist).
  void start(Serve serve);

  // The lock of the clocks, and of the owner's payload: a push and its clock move together.
  std::mutex& mutex() const { return mutex_; }
  // With mutex() held: `worker`'s push at `clock` was applied (its clock never goes back).
  Clocks record_push_locked(int worker, int64_t clock);
  Clocks clocks_locked() const;
  // The clocks as this rank's server knows them, without communication (rethrows a server failure first).
  Clocks clocks() const;

  // The worker side, before each call: rethrows a server thread's failure; refuses a call after finish().
  void check_usable(const char* op) const;
  void rethrow_failure() const;
  // Says goodbye to every server, waits until this rank's server threads ended (every other worker said
  // goodbye), rethrows a failure. Idempotent.
  void finish();
  bool finished() const { return finished_; }

  // The header of a request: int64 [header_words], type and clock set, the rest 0.
  at::Tensor header(int64_t type, int64_t clock) const;
  void count_bytes(int64_t bytes) { bytes_sent_ += bytes; }
  int64_t bytes_sent() const { return bytes_sent_; }

  Communicator& group() const { return group_; }
  Millis timeout() const { return timeout_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return name_; }
  int64_t header_words() const { return header_words_; }

 private:
  void serve_worker(int worker, const Serve& serve);
  void record_failure(int worker, const std::exception& e);

  Communicator& group_;
  Millis timeout_;
  std::string name_;
  int request_tag_;
  int64_t header_words_;
  int rank_, size_;
  mutable std::mutex mutex_;
  std::vector<int64_t> clocks_;
  int64_t version_ = 0;
  std::exception_ptr failure_;
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<bool> stop_{false};
  bool finished_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace crosstrain::comm
