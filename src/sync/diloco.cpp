// sync.mode = "diloco": the reducer runs inside each cluster; every H inner steps (sync.inner_steps) each cluster's
// pseudo-gradient (the parameters at the last outer step minus now) is averaged across clusters, optionally
// compressed with error feedback and weighted by the cluster's share of the batch (sync.cluster_batch), and an
// outer SGD step with Nesterov momentum moves every replica to the same new parameters. Streaming DiLoCo
// (sync.fragments > 1): fragments of the parameters sync on a staggered schedule, each exchange overlapping
// sync.overlap_steps inner steps on its own thread. Also the pure parts of the mode that tests call
// (outer_weight, outer_nesterov_step, fragment_offset; declared in crosstrain/sync/strategy.h).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <future>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/train/config.h"
#include "modes.h"
#include "strategy_base.h"

namespace crosstrain::train {
using namespace sync_detail;

namespace {

int64_t numel(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

class DiLoCo : public StrategyBase {
 public:
  // Clusters that train on uneven shares of the batch (sync.cluster_batch) count by their share in the outer
  // average, so that every sequence counts the same, as in data parallelism: a cluster that processed 3x the
  // sequences brings 3x the evidence (with H = 1 and plain SGD inside, the weighted mean is exactly the
  // gradient of the whole global batch). An unweighted mean would give each sequence of the smaller share 3x
  // the say. Each cluster scales its own pseudo-gradient, so the exchange stays a plain mean.
  DiLoCo(SyncSetup s, ClusterGroups g)
      : StrategyBase(std::move(s), std::move(g)),
        weight_(outer_weight(cluster_counts(), g_.cluster)) {}

  // Fragments of the attached tensors, each with its outer momentum (kept as views per tensor for checkpoints).
  void attached() override {
    // Sharded tensors (ZeRO): each rank exchanges its own slices with its counterparts; nothing to gather.
    if (sharded_ && !g_.layout.balanced)
      throw UsageError("DiLoCo across clusters of different sizes exchanges whole parameters, which ZeRO shards: "
                       "set parallel.zero = 0");
    average_ = std::make_unique<CrossClusterAverage>(sharded_ ? nullptr : g_.local.get(), g_.cross,
                                                     s_.config.compression, s_.timeout, !g_.layout.balanced);
    // Fragments: consecutive parameters (in name order: layers stay together) of about equal size.
    const int64_t F = std::max<int64_t>(1, s_.config.fragments);
    int64_t total = 0;
    for (const auto& p : s_.parameters) total += p.numel();
    int64_t acc = 0;
    fragments_.resize(F);
    for (const auto& p : s_.parameters) {
      int64_t f = std::min<int64_t>(F - 1, acc * F / std::max<int64_t>(1, total));
      fragments_[f].params.push_back(p);
      acc += p.numel();
    }
    for (auto& fr : fragments_) {
      fr.momentum = at::zeros({numel(fr.params)}, at::kFloat);
      // NaN until a checkpoint provides it: start() then takes the parameters.
      fr.anchor = at::full({numel(fr.params)}, std::numeric_limits<float>::quiet_NaN(), at::kFloat);
      int64_t offset = 0;
      for (const auto& p : fr.params) {
        momentum_views_.push_back(fr.momentum.slice(0, offset, offset + p.numel()).view(p.sizes()));
        anchor_views_.push_back(fr.anchor.slice(0, offset, offset + p.numel()).view(p.sizes()));
        offset += p.numel();
      }
    }
  }
  // The outer momentum and the outer parameters (every cluster's anchor is the same, so a run resumed between
  // outer steps still lands its next outer step on common ground).
  std::vector<ExtraState> state() override {
    return {{"#outer_momentum", momentum_views_}, {"#outer_anchor", anchor_views_}};
  }
  void start(int64_t first_step) override {
    for (auto& fr : fragments_)
      if (at::isnan(fr.anchor).any().item<bool>()) fr.anchor.copy_(flatten(fr.params));
  }
  std::string describe() const override {
    std::string d = "diloco (H=" + std::to_string(s_.config.inner_steps) + ", outer lr " +
                    std::to_string(s_.config.outer_lr).substr(0, 4) + ", momentum " +
                    std::to_string(s_.config.outer_momentum).substr(0, 4) + (s_.config.nesterov ? " nesterov" : "") +
                    ", " + std::to_string(g_.layout.clusters) + " clusters";
    if (s_.config.compression != "none") d += ", outer gradients " + s_.config.compression;
    if (!s_.config.cluster_batch.empty())
      d += ", cluster batches " + s_.config.cluster_batch + " (outer mean weighted by them)";
    if (fragments_.size() > 1)
      d += ", streaming " + std::to_string(fragments_.size()) + " fragments overlapping " +
           std::to_string(s_.config.overlap_steps) + " steps";
    return d + ")";
  }
  comm::Communicator* gradient_group() const override { return g_.local.get(); }
  // The clusters' inner optimizers (and, between outer steps, parameters) differ: a copy per cluster.
  CheckpointCopy checkpoint_copy() const override {
    return {g_.cluster, g_.local_index, static_cast<int>(g_.layout.local[g_.cluster].size())};
  }

  void settle(int64_t step) override {
    if (pending_ >= 0) land(step);
  }

  void after_step(int64_t step, bool last) override {
    const int64_t H = std::max<int64_t>(1, s_.config.inner_steps), F = static_cast<int64_t>(fragments_.size());
    // A pending exchange lands `overlap_steps` after it started (or now, before anything else starts).
    if (pending_ >= 0 && (step >= pending_due_ || last)) land(step);
    if (last) {
      for (int64_t f = 0; f < F; ++f) {
        start(f, step);
        land(step);
      }
      return;
    }
    for (int64_t f = 0; f < F; ++f) {
      if ((step - fragment_offset(f, F, H)) % H != 0 || step < fragment_offset(f, F, H)) continue;
      if (pending_ >= 0) land(step);
      start(f, step);
      pending_due_ = step + (F > 1 ? s_.config.overlap_steps : 0);
      if (pending_due_ <= step) land(step);
    }
  }

 private:
  struct Fragment {
    std::vector<at::Tensor> params;
    at::Tensor anchor, momentum;
    at::Tensor sent;    // the parameters when its exchange started
    at::Tensor piece;   // this rank's piece of the pseudo-gradient, averaged across clusters when landed
  };

  void start(int64_t f, int64_t step) {
    Fragment& fr = fragments_[f];
    blocking("diloco outer gradient (fragment " + std::to_string(f) + ")", step, [&] {
      fr.sent = flatten(fr.params).clone();
      at::Tensor delta = fr.anchor - fr.sent;  // the pseudo-gradient
      if (weight_ != 1.0) delta.mul_(weight_);
      fr.piece = average_->piece_of(delta);
      if (fragments_.size() > 1 && s_.config.overlap_steps > 0) {
        // Overlapped: the cross-cluster exchange runs on its own thread (only the cross group is used there).
        exchange_ = std::async(std::launch::async, [this, &fr, f] { average_->exchange(fr.piece, f); });
      } else {
        average_->exchange(fr.piece, f);
      }
    });
    pending_ = f;
  }

  void land(int64_t step) {
    Fragment& fr = fragments_[pending_];
    blocking("diloco outer step (fragment " + std::to_string(pending_) + ")", step, [&] {
      if (exchange_.valid()) exchange_.get();  // bounded: every operation inside has the timeout
      at::Tensor delta = at::empty_like(fr.anchor);
      average_->gather(delta, fr.piece);
      outer_nesterov_step(fr.anchor, fr.momentum, delta, s_.config.outer_lr, s_.config.outer_momentum,
                          s_.config.nesterov);
      // The new outer parameters, plus what the inner steps did while the exchange was in flight.
      at::Tensor now = flatten(fr.params);
      unflatten(fr.anchor + (now - fr.sent), fr.params);
      if (changed_) changed_();
    });
    pending_ = -1;
    ++stats_.exchanges;
    stats_.wan_bytes = average_->bytes();
  }

  // Each cluster's sequences per step, for the weights: sync.cluster_batch, else (clusters of different sizes,
  // every rank the same batch) the ranks of each; empty for an even split.
  std::vector<int64_t> cluster_counts() const {
    std::vector<int64_t> counts = parse_cluster_batch(s_.config.cluster_batch);
    if (counts.empty() && !g_.layout.balanced)
      for (const auto& ranks : g_.layout.local) counts.push_back(static_cast<int64_t>(ranks.size()));
    return counts;
  }

  double weight_;  // this cluster's pseudo-gradient factor in the outer mean (1: an even split)
  std::unique_ptr<CrossClusterAverage> average_;
  std::vector<Fragment> fragments_;
  std::vector<at::Tensor> momentum_views_, anchor_views_;
  int64_t pending_ = -1, pending_due_ = 0;
  std::future<void> exchange_;
};

}  // namespace

// ---- pure parts ---------------------------------------------------------------------------------------------

double outer_weight(const std::vector<int64_t>& cluster_batch, int cluster) {
  if (cluster_batch.empty()) return 1.0;
  int64_t sum = 0;
  for (int64_t n : cluster_batch) sum += n;
  return static_cast<double>(cluster_batch.size()) * static_cast<double>(cluster_batch[cluster]) /
         static_cast<double>(sum);
}

void outer_nesterov_step(at::Tensor& anchor, at::Tensor& momentum, const at::Tensor& delta, double lr, double mu,
                         bool nesterov) {
  momentum.mul_(mu).add_(delta);
  if (nesterov)
    anchor.sub_(delta + momentum * mu, lr);
  else
    anchor.sub_(momentum, lr);
}

int64_t fragment_offset(int64_t f, int64_t fragments, int64_t inner_steps) {
  return (f + 1) * inner_steps / fragments;
}

std::unique_ptr<SyncStrategy> sync_detail::make_diloco(SyncSetup s, ClusterGroups g) {
  return std::make_unique<DiLoCo>(std::move(s), std::move(g));
}

}  // namespace crosstrain::train
