// Private to src/sync: what the sync modes share. The groups of a rank (ClusterGroups, built by build_groups in
// strategy.cpp), flat views of a list of tensors, the cross-cluster average of a flat buffer (hierarchical sync
// and DiLoCo), and StrategyBase, the base class of every mode's strategy (the attached tensors, the experiment's
// slowdown, the statistics, and blocking(), which times and labels a mode's exchanges). Each mode lives in its own
// file (sync_every_step.cpp, diloco.cpp, server_sync.cpp, gossip.cpp) behind a factory declared in modes.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/core/error.h"
#include "crosstrain/sync/strategy.h"

namespace crosstrain::train::sync_detail {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---- flat views of a list of parameters -------------------------------------------------------------------

// The tensors one after the other, as one new float tensor (empty for no tensors).
at::Tensor flatten(const std::vector<at::Tensor>& params);
// Copies consecutive slices of `flat` into the tensors (without recording gradients).
void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& params);

// Wraps a communication failure with the strategy's context (world rank, step, what it was doing).
template <class F>
auto with_context(const std::string& what, int world_rank, int64_t step, F&& f) {
  try {
    return f();
  } catch (const CommError&) {
    throw;  // it names rank, operation, peer and step already; elastic training recovers from it by its type
  } catch (const Error& e) {
    throw Error("sync: " + what + " failed on world rank " + std::to_string(world_rank) + " at step " +
                std::to_string(step) + ": " + e.what());
  }
}

// The groups a rank belongs to.
struct ClusterGroups {
  ClusterLayout layout;
  int cluster = 0, local_index = 0;
  std::unique_ptr<comm::Communicator> local;  // null when of size 1
  // Null when of size 1. With one data-parallel rank per cluster the cross group is the data-parallel group
  // itself (no group of its own to form, which costs round trips across the wide-area link), unless its exchange
  // overlaps the steps on a thread of its own (streaming DiLoCo), where it needs a group nothing else uses.
  comm::Communicator* cross = nullptr;
  std::unique_ptr<comm::Communicator> own_cross;
};

// Averages a flat buffer over all replicas when every rank of a cluster holds the same buffer: each rank of a
// cluster averages 1/L of it with its counterparts in the other clusters (the only traffic that crosses), then
// the cluster all-gathers the pieces. Every rank ends with bit-identical values. `whole`: clusters of different
// sizes have no counterparts to pair; their leaders (`cross`, null elsewhere) average whole buffers and each
// broadcasts the result inside its cluster.
class CrossClusterAverage {
 public:
  CrossClusterAverage(comm::Communicator* local, comm::Communicator* cross, const std::string& codec,
                      comm::Millis timeout, bool whole = false);
  int local_size() const { return local_ && !whole_ ? local_->size() : 1; }
  int local_rank() const { return local_ && !whole_ ? local_->rank() : 0; }

  // This rank's piece of `flat` (a copy, zero-padded to equal pieces).
  at::Tensor piece_of(const at::Tensor& flat) const;
  // Across clusters (may run on another thread than the training loop; uses only the cross group).
  void exchange(at::Tensor& piece, int64_t buffer_id);
  // Inside the cluster: every piece to every rank.
  void gather(at::Tensor& flat, const at::Tensor& piece);
  void average(at::Tensor& flat, int64_t buffer_id);
  int64_t bytes() const { return bytes_; }

 private:
  comm::Communicator* local_;
  comm::Communicator* cross_;
  comm::Millis timeout_;
  bool whole_;
  std::unique_ptr<comm::Codec> codec_;
  comm::ErrorFeedback feedback_;
  int64_t bytes_ = 0;  // touched by one thread at a time (an exchange is joined before the next starts)
};

class StrategyBase : public SyncStrategy {
 public:
  StrategyBase(SyncSetup s, ClusterGroups g) : s_(std::move(s)), g_(std::move(g)) {}
  int cluster() const override { return g_.cluster; }
  const ClusterLayout& layout() const override { return g_.layout; }
  // Replicas that step alone (gossip, async, ssp) each keep a copy; the others override.
  CheckpointCopy checkpoint_copy() const override { return {s_.dp_index, 0, 1}; }
  void attach(std::vector<at::Tensor> tensors, bool sharded, std::function<void()> changed) override;
  void before_step(int64_t step) override;
  SyncStats stats() const override { return stats_; }

 protected:
  // Runs f, adds its time to blocked_s, wraps failures.
  template <class F>
  void blocking(const std::string& what, int64_t step, F&& f) {
    const auto t = Clock::now();
    with_context(what, s_.world_rank, step, [&] {
      f();
      return 0;
    });
    stats_.blocked_s += seconds_since(t);
  }
  // The attached tensors were replaced: tell the optimizer (ZeRO re-gathers its parameters).
  void set_tensors(const at::Tensor& flat);
  virtual void attached() {}
  SyncSetup s_;
  ClusterGroups g_;
  bool sharded_ = false;
  std::function<void()> changed_;
  SyncStats stats_;
};

}  // namespace crosstrain::train::sync_detail
