// A sharded parameter server for the `async` and `ssp` sync modes.
//
// Every rank of the group owns one shard of the flat parameter vector (shard i on rank i), serves it with one
// thread per other worker (each waits for that worker's next request), and is also a worker. A worker pushes its local progress (parameters now minus parameters at its last pull)
// to every server and pulls the servers' shards in the same round trip; a server adds delta / workers to its
// shard and answers with the shard, its version (pushes applied), the clocks of every worker and the staleness
// of the push (pushes of other workers applied since this worker's previous pull). No barrier: a server serves
// requests in the order they arrive, a worker only waits for its own replies. Requests to the server of its
// own rank are handled in place. Every receive and send has the communicator's timeout; a server thread's
// failure is rethrown by the next call of the worker on that rank.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

class ParameterServer {
 public:
  // `group`: used by this object only (a dedicated split). `initial`: the flat parameters this rank starts from
  // (identical everywhere in a fresh run; after a resume, this replica's copy): its shard seeds this rank's server.
  // `initial_clock`: every worker's clock at the start (the last step done: a resumed run starts past 0).
  ParameterServer(comm::Communicator& group, const at::Tensor& initial, comm::Millis timeout, int64_t initial_clock = 0);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  struct Reply {
    int64_t min_clock = 0;    // the slowest worker's clock
    int slowest = 0;          // its rank
    int64_t staleness = 0;    // of this push: the most pushes of other workers any server applied since our pull
  };
  // Pushes `delta` (flat, may be all zeros: a pull) stamped with `clock`, and writes the servers' parameters
  // into `params` (flat). Throws CommError/Error naming the server rank on a failure or timeout.
  Reply push_pull(const at::Tensor& delta, at::Tensor& params, int64_t clock);
  // The clocks as the server of this rank knows them (no communication).
  Reply local_clocks() const;
  // Says goodbye to every server; the server thread ends when every worker has (bounded by the timeout).
  void finish();

  int64_t shard_begin(int s) const;
  int64_t shard_end(int s) const;
  int64_t bytes_sent() const { return bytes_sent_; }

 private:
  enum Type : int64_t { kPush = 1, kBye = 2 };
  void serve(int worker);
  // Applies a push of worker `w` to this rank's shard and fills the reply header.
  void handle(int w, int64_t type, int64_t clock, const at::Tensor* delta, at::Tensor& reply_header);
  void rethrow_server_failure() const;

  comm::Communicator& group_;
  comm::Millis timeout_;
  int rank_, size_;
  int64_t numel_;
  mutable std::mutex mutex_;  // the shard and the bookkeeping below
  at::Tensor shard_;
  std::vector<int64_t> clocks_, last_pull_version_;
  int64_t version_ = 0;
  int64_t bytes_sent_ = 0;
  std::exception_ptr server_failure_;
  std::atomic<bool> stop_{false};
  int servers_done_ = 0;
  bool finished_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace crosstrain::train
