// A sharded parameter server for the `async` and `ssp` sync modes, on the skeleton every parameter server
// shares (comm/param_server_core.h: a thread per other worker, clocks, goodbye, failures).
//
// Every rank of the group owns one shard of the flat parameter vector (shard i on rank i). A worker pushes its
// local progress (parameters now minus parameters at its last pull) to every server and pulls the servers'
// shards in the same round trip; a server adds delta / workers to its shard and answers with the shard, its
// version (pushes applied), the clocks of every worker and the staleness of the push (pushes of other workers
// applied since this worker's previous pull). No barrier: a server serves requests in the order they arrive, a
// worker only waits for its own replies. Every receive and send has the communicator's timeout.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/param_server_core.h"

namespace crosstrain::train {

class ParameterServer {
 public:
  // `group`: used by this object only (a dedicated split). `initial`: the flat parameters this rank starts from
  // (identical everywhere in a fresh run; after a resume, this replica's copy): its shard seeds this rank's server.
  // `initial_clock`: every worker's clock at the start (the last step done: a resumed run starts past 0).
  ParameterServer(comm::Communicator& group, const at::Tensor& initial, comm::Millis timeout, int64_t initial_clock = 0);
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  struct Reply {
    int64_t min_clock = 0;    // the slowest worker's clock
    int slowest = 0;          // its rank
    int64_t staleness = 0;    // of this push: the most pushes of other workers any server applied since our pull
    bool stop = false;        // a server of this push has heard that a worker was asked to stop (Ctrl-C)
  };
  // Pushes `delta` (flat, may be all zeros: a pull) stamped with `clock`, and writes the servers' parameters
  // into `params` (flat). Throws CommError/Error naming the server rank on a failure or timeout.
  Reply push_pull(const at::Tensor& delta, at::Tensor& params, int64_t clock);
  // The clocks as the server of this rank knows them (no communication).
  Reply local_clocks() const;
  // This worker was asked to stop: every later push tells the servers, whose replies tell every worker that
  // pushes to them after that (Reply::stop).
  void ask_to_stop() { stop_asked_ = true; }
  // Says goodbye to every server; the server thread ends when every worker has (bounded by the timeout).
  void finish();

  int64_t shard_begin(int s) const;
  int64_t shard_end(int s) const;
  int64_t bytes_sent() const { return core_.bytes_sent(); }

 private:
  enum Type : int64_t { kPush = 1 };
  void serve(int worker, const at::Tensor& header);
  // Applies a push of worker `w` to this rank's shard and fills the reply header.
  void handle(int w, int64_t clock, const at::Tensor& delta, at::Tensor& reply_header);

  int rank_, size_;
  int64_t numel_;
  at::Tensor shard_;                        // under core_.mutex()
  std::vector<int64_t> last_pull_version_;  // under core_.mutex()
  std::atomic<bool> stop_asked_{false};     // this worker's Ctrl-C, sent with each push
  std::atomic<bool> stop_known_{false};     // this rank's server has heard of one
  comm::ParamServerCore core_;              // last: its threads stop before the shard goes
};

}  // namespace crosstrain::train
