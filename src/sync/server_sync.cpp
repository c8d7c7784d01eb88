// sync.mode = "ssp" and "async": no per-step all-reduce; every rank is a worker of the sharded parameter server
// (param_server.h) that pushes its progress and pulls the servers' parameters every sync.period steps. ssp
// bounds the staleness: a rank may run at most sync.staleness steps ahead of the slowest worker (it waits in
// before_step); async never waits for the others. On the last step every worker pushes, all meet at a barrier,
// and each pulls the same final model.
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/sync/param_server.h"
#include "crosstrain/train/sync_mode.h"
#include "modes.h"
#include "strategy_base.h"

namespace crosstrain::train {
using namespace sync_detail;

namespace {

class ServerSync : public StrategyBase {
 public:
  ServerSync(SyncSetup s, ClusterGroups g, std::unique_ptr<comm::Communicator> ps_group)
      : StrategyBase(std::move(s), std::move(g)), group_(std::move(ps_group)),
        bounded_(sync_traits(s_.config).mode == SyncMode::Ssp) {}
  // The servers start from the parameters this run starts with; every worker's clock is the last step done.
  void start(int64_t first_step) override {
    pulled_ = flatten(s_.parameters).clone();
    if (group_) server_ = std::make_unique<ParameterServer>(*group_, pulled_, s_.timeout, first_step - 1);
  }
  ~ServerSync() override {
    if (server_) {
      try {
        server_->finish();
      } catch (...) {
      }
    }
  }
  bool bounded() const { return bounded_; }
  std::string describe() const override {
    return std::string(bounded() ? "ssp (at most " + std::to_string(s_.config.staleness) + " steps ahead, "
                                 : "async (") +
           "sharded parameter server on " + std::to_string(s_.dp_size) + " ranks, push every " +
           std::to_string(s_.config.period) + " steps)";
  }
  comm::Communicator* gradient_group() const override { return nullptr; }
  void ask_to_stop() override {
    if (server_) server_->ask_to_stop();
    else stop_heard_ = true;  // one worker: nobody else to tell
  }
  bool stop_heard() const override { return stop_heard_; }

  void before_step(int64_t step) override {
    StrategyBase::before_step(step);
    if (!server_ || !bounded()) return;
    // Step `step` may start when this rank (clock step - 1) is at most `staleness` ahead of the slowest.
    const auto start = Clock::now();
    for (;;) {
      auto r = server_->local_clocks();
      if (step - 1 - r.min_clock <= s_.config.staleness) break;
      if (seconds_since(start) * 1000 > static_cast<double>(s_.timeout.count()))
        throw Error("sync: ssp on world rank " + std::to_string(s_.world_rank) + " waited " +
                    std::to_string(s_.timeout.count() / 1000) + " s at step " + std::to_string(step) +
                    " for data-parallel rank " + std::to_string(r.slowest) + " (at step " +
                    std::to_string(r.min_clock) + ") to come within " + std::to_string(s_.config.staleness) +
                    " steps");
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stats_.blocked_s += seconds_since(start);
  }

  void after_step(int64_t step, bool last) override {
    if (!server_) return;
    const int64_t period = std::max<int64_t>(1, s_.config.period);
    if (step % period == 0 || last) push(step);
    if (last) {
      // Every final push is in before anyone pulls the final model.
      blocking("parameter server final barrier", step, [&] { s_.dp->barrier()->wait(s_.timeout); });
      at::Tensor zero = at::zeros_like(pulled_);
      blocking("parameter server final pull", step, [&] {
        server_->push_pull(zero, pulled_, step);
        set_tensors(pulled_);
        server_->finish();
      });
    }
  }

 private:
  void push(int64_t step) {
    blocking("parameter server push/pull", step, [&] {
      at::Tensor now = flatten(s_.parameters);
      at::Tensor delta = now - pulled_;
      auto r = server_->push_pull(delta, pulled_, step);
      set_tensors(pulled_);
      stop_heard_ = stop_heard_ || r.stop;
      ++pushes_;
      staleness_sum_ += r.staleness;
      stats_.staleness_max = std::max(stats_.staleness_max, r.staleness);
      stats_.staleness_mean = static_cast<double>(staleness_sum_) / static_cast<double>(pushes_);
    });
    ++stats_.exchanges;
    // Bytes to servers in other clusters: their shards of the push (the replies come back the same size).
    int64_t cross = 0;
    for (int srv = 0; srv < s_.dp_size; ++srv)
      if (g_.layout.cluster_of[srv] != g_.cluster) cross += 4 * (server_->shard_end(srv) - server_->shard_begin(srv)) + 32;
    stats_.wan_bytes += cross;
  }

  std::unique_ptr<comm::Communicator> group_;
  const bool bounded_;  // ssp (else async)
  std::unique_ptr<ParameterServer> server_;
  at::Tensor pulled_;
  int64_t pushes_ = 0, staleness_sum_ = 0;
  bool stop_heard_ = false;
};

}  // namespace

std::unique_ptr<SyncStrategy> sync_detail::make_server_sync(SyncSetup s, ClusterGroups g) {
  // The parameter server's own group: every data-parallel rank, split off so that its traffic stays apart.
  std::unique_ptr<comm::Communicator> ps;
  if (s.dp) {
    std::vector<int> all(s.dp_size);
    for (int i = 0; i < s.dp_size; ++i) all[i] = i;
    ps = s.dp->split(all);
  }
  return std::make_unique<ServerSync>(std::move(s), std::move(g), std::move(ps));
}

}  // namespace crosstrain::train
