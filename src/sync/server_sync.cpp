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
  // The servers start from the parameters this run starts with; every worker's clock is the last step done. They
  // are built at the first step: elastic training puts the generation's state in place after start() (rebase).
  void start(int64_t first_step) override {
    pulled_ = flatten(s_.parameters).clone();
    seed_ = pulled_.clone();  // pulled_ changes under elastic training before the servers are built
    first_clock_ = first_step - 1;
  }
  // What this worker last pulled: its next push sends its progress since then, so a generation carries it.
  std::vector<at::Tensor> live_tensors() override {
    std::vector<at::Tensor> views;
    int64_t offset = 0;
    for (const at::Tensor& t : s_.parameters) {
      views.push_back(pulled_.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
    return views;
  }
  // A new generation of workers: the server's shards (one of them lost with its rank) start again from the
  // survivors' last pulls, averaged (each a copy of every shard, at most sync.period steps old), and every
  // worker's clock from the generation's first step. A survivor keeps its parameters and its last pull, so the
  // progress it has not pushed yet goes with its next push; a joiner starts from the servers' parameters, as a
  // new worker pulls before it trains (its copy of the donor's would push the donor's progress twice).
  void rebase(int64_t first_step, bool received) override {
    first_clock_ = first_step - 1;
    if (!s_.dp) return;
    at::NoGradGuard no_grad;
    at::Tensor sum = at::zeros({pulled_.numel() + 1}, at::kFloat);
    if (!received) {
      sum.narrow(0, 0, pulled_.numel()).copy_(pulled_);
      sum[pulled_.numel()].fill_(1.0);
    }
    blocking("parameter server re-sharding", first_step, [&] { s_.dp->all_reduce(sum, comm::ReduceOp::Sum)->wait(s_.timeout); });
    const float holders = sum[pulled_.numel()].item<float>();
    if (holders < 1) throw Error("sync: no worker of the new generation holds a pull of the parameter server (a bug)");
    seed_ = sum.narrow(0, 0, pulled_.numel()) / holders;
    if (received) {
      pulled_.copy_(seed_);
      set_tensors(seed_);
    }
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
    else if (group_) stop_asked_early_ = true;  // before the first step: told once the servers are built
    else stop_heard_ = true;  // one worker: nobody else to tell
  }
  bool stop_heard() const override { return stop_heard_; }

  void before_step(int64_t step) override {
    // Before anything else of the step (the experiment's slowdown sleeps in the base): the other workers' pushes
    // wait for this rank's server to take them.
    if (group_ && !server_) {
      server_ = std::make_unique<ParameterServer>(*group_, seed_, s_.timeout, first_clock_);
      if (stop_asked_early_) server_->ask_to_stop();
    }
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
  std::unique_ptr<ParameterServer> server_;  // built at the first step (start() and rebase() say from what)
  at::Tensor pulled_;
  at::Tensor seed_;          // the servers' first parameters (flat; each server keeps its shard)
  int64_t first_clock_ = 0;  // every worker's clock when the servers start
  int64_t pushes_ = 0, staleness_sum_ = 0;
  bool stop_heard_ = false;
  bool stop_asked_early_ = false;
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
