// sync.mode = "gossip": no per-step all-reduce; every sync.period steps each rank averages its parameters with
// one neighbour (the pairs change each round, gossip_partner), so no step waits for more than one other replica.
// On the last step one all-reduce over all replicas leaves every rank with the same final model. Also the pure
// pairing rule that tests call (gossip_partner, declared in crosstrain/sync/strategy.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "modes.h"
#include "strategy_base.h"

namespace crosstrain::train {
using namespace sync_detail;

namespace {
constexpr int kTagGossip = 7201;

class Gossip : public StrategyBase {
 public:
  Gossip(SyncSetup s, ClusterGroups g) : StrategyBase(std::move(s), std::move(g)) {}
  std::string describe() const override {
    return "gossip (every " + std::to_string(s_.config.period) + " steps with one neighbour; " +
           std::to_string(s_.dp_size) + " ranks, no global barrier)";
  }
  comm::Communicator* gradient_group() const override { return nullptr; }
  void after_step(int64_t step, bool last) override {
    if (!s_.dp) return;
    const int64_t period = std::max<int64_t>(1, s_.config.period);
    if (last) {
      // The final model is the average of all replicas: one all-reduce at the end.
      blocking("gossip final average", step, [&] {
        at::Tensor flat = flatten(s_.parameters);
        s_.dp->all_reduce(flat, comm::ReduceOp::Avg)->wait(s_.timeout);
        set_tensors(flat);
        if (g_.layout.clusters > 1) stats_.wan_bytes += 4 * flat.numel();
      });
      return;
    }
    if (step % period != 0) return;
    const int64_t round = step / period - 1;
    const int peer = gossip_partner(s_.dp_index, s_.dp_size, round);
    if (peer == s_.dp_index) return;
    blocking("gossip exchange with data-parallel rank " + std::to_string(peer), step, [&] {
      at::Tensor mine = flatten(s_.parameters);
      at::Tensor theirs = at::empty_like(mine);
      auto sent = s_.dp->send(mine, peer, kTagGossip);
      auto got = s_.dp->recv(theirs, peer, kTagGossip);
      got->wait(s_.timeout);
      sent->wait(s_.timeout);
      set_tensors((mine + theirs) * 0.5);
      if (g_.layout.cluster_of[peer] != g_.cluster) stats_.wan_bytes += 4 * mine.numel();
    });
    ++stats_.exchanges;
  }
};

}  // namespace

int gossip_partner(int i, int n, int64_t round) {
  if (n <= 1) return i;
  if ((n & (n - 1)) == 0) {
    int bits = 0;
    while ((1 << bits) < n) ++bits;
    return i ^ (1 << (round % bits));
  }
  const int64_t s = (2 * round + 1) % n;
  return static_cast<int>(((s - i) % n + n) % n);
}

std::unique_ptr<SyncStrategy> sync_detail::make_gossip(SyncSetup s, ClusterGroups g) {
  return std::make_unique<Gossip>(std::move(s), std::move(g));
}

}  // namespace crosstrain::train
