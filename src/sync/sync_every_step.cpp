// sync.mode = "sync": every step the gradients are all-reduced over the replicas. Flat, the optimizer's reducer
// does it over the whole data-parallel group and this strategy only names that group; hierarchical
// (sync.hierarchical), the reducer runs inside each cluster and after backward this strategy averages the
// gradients (and the loss) once across clusters through CrossClusterAverage. Every replica stays identical.
#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "modes.h"
#include "strategy_base.h"

namespace crosstrain::train {
using namespace sync_detail;

namespace {

at::Tensor flatten_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const auto& p : params)
    flat.push_back(p.grad().defined() ? p.grad().reshape(-1) : at::zeros({p.numel()}, p.options()));
  return at::cat(flat);
}

void unflatten_grads(const at::Tensor& flat, std::vector<at::Tensor>& params) {
  int64_t offset = 0;
  for (auto& p : params) {
    if (p.grad().defined()) p.mutable_grad().copy_(flat.slice(0, offset, offset + p.numel()).view_as(p));
    offset += p.numel();
  }
}

class SyncEveryStep : public StrategyBase {
 public:
  SyncEveryStep(SyncSetup s, ClusterGroups g)
      : StrategyBase(std::move(s), std::move(g)), average_(g_.local.get(), g_.cross, "none", s_.timeout) {}
  std::string describe() const override {
    return s_.config.hierarchical ? "sync (hierarchical: inside " + std::to_string(g_.layout.clusters) +
                                        " clusters, then across)"
                                  : "sync (every step, all replicas)";
  }
  comm::Communicator* gradient_group() const override { return s_.config.hierarchical ? g_.local.get() : s_.dp; }
  // Every replica is identical: one copy, written by all of them.
  CheckpointCopy checkpoint_copy() const override { return {0, s_.dp_index, s_.dp_size}; }
  double after_backward(int64_t step, double loss) override {
    if (!s_.config.hierarchical || !g_.cross) return loss;
    blocking("cross-cluster gradient average", step, [&] {
      at::Tensor flat = flatten_grads(s_.parameters);
      at::Tensor with_loss = at::cat({flat, at::full({1}, loss, at::kFloat)});
      average_.average(with_loss, 0);
      unflatten_grads(with_loss.slice(0, 0, flat.numel()), s_.parameters);
      loss = with_loss[flat.numel()].item<double>();
    });
    stats_.wan_bytes = average_.bytes();
    ++stats_.exchanges;
    return loss;
  }

 private:
  CrossClusterAverage average_;
};

}  // namespace

std::unique_ptr<SyncStrategy> sync_detail::make_sync_every_step(SyncSetup s, ClusterGroups g) {
  return std::make_unique<SyncEveryStep>(std::move(s), std::move(g));
}

}  // namespace crosstrain::train
