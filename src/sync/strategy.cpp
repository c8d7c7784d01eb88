#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/sync_mode.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <future>
#include <limits>
#include <map>
#include <thread>

#include <unistd.h>

#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/core/error.h"
#include "crosstrain/sync/param_server.h"

namespace crosstrain::train {
namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
constexpr int kTagGossip = 7201;

// ---- flat views of a list of parameters -------------------------------------------------------------------

int64_t numel(const std::vector<at::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

at::Tensor flatten(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().reshape(-1));
  return flat.empty() ? at::empty({0}, at::kFloat) : at::cat(flat);
}

void unflatten(const at::Tensor& flat, std::vector<at::Tensor>& params) {
  at::NoGradGuard no_grad;
  int64_t offset = 0;
  for (auto& p : params) {
    p.detach().copy_(flat.slice(0, offset, offset + p.numel()).view_as(p));
    offset += p.numel();
  }
}

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

// Wraps a communication failure with the strategy's context (world rank, step, what it was doing).
template <class F>
auto with_context(const std::string& what, int world_rank, int64_t step, F&& f) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error("sync: " + what + " failed on world rank " + std::to_string(world_rank) + " at step " +
                std::to_string(step) + ": " + e.what());
  }
}

// The groups a rank belongs to.
struct ClusterGroups {
  ClusterLayout layout;
  int cluster = 0, local_index = 0;
  std::unique_ptr<comm::Communicator> local, cross;  // null when of size 1
};

// `split`: also create the local and cross groups (modes that average inside and across clusters).
ClusterGroups build_groups(const SyncSetup& s, bool split) {
  ClusterGroups g;
  std::vector<int> ids;
  const bool plain = sync_traits(s.config).mode == SyncMode::Sync && !s.config.hierarchical;
  if (plain) {
    ids.assign(s.dp_size, 0);  // plain sync: nothing depends on clusters, so nothing is exchanged
  } else if (s.config.clusters > 0) {
    ids = block_clusters(s.dp_size, static_cast<int>(s.config.clusters));
  } else if (s.dp) {
    at::Tensor mine = at::full({1}, static_cast<int64_t>(s.cluster_hint), at::kLong);
    at::Tensor all = at::empty({s.dp_size}, at::kLong);
    s.dp->all_gather(mine, all)->wait(s.timeout);
    bool any_missing = false;
    for (int i = 0; i < s.dp_size; ++i) {
      ids.push_back(static_cast<int>(all[i].item<int64_t>()));
      any_missing |= ids.back() < 0;
    }
    if (any_missing) ids.assign(s.dp_size, 0);
  } else {
    ids.assign(s.dp_size, 0);
  }
  g.layout = cluster_layout(ids);
  g.cluster = g.layout.cluster_of[s.dp_index];
  const auto& mine = g.layout.local[g.cluster];
  g.local_index = static_cast<int>(std::find(mine.begin(), mine.end(), s.dp_index) - mine.begin());
  if (!s.dp || !split) return g;
  // split() is collective over the data-parallel group: every rank walks every group in the same order.
  for (const auto& ranks : g.layout.local) {
    auto sub = s.dp->split(ranks);
    if (sub && ranks.size() > 1) g.local = std::move(sub);
  }
  if (g.layout.balanced) {
    for (const auto& ranks : g.layout.cross) {
      auto sub = s.dp->split(ranks);
      if (sub && ranks.size() > 1) g.cross = std::move(sub);
    }
  }
  return g;
}

// Averages a flat buffer over all replicas when every rank of a cluster holds the same buffer: each rank of a
// cluster averages 1/L of it with its counterparts in the other clusters (the only traffic that crosses), then
// the cluster all-gathers the pieces. Every rank ends with bit-identical values.
class CrossClusterAverage {
 public:
  CrossClusterAverage(comm::Communicator* local, comm::Communicator* cross, const std::string& codec,
                      comm::Millis timeout)
      : local_(local), cross_(cross), timeout_(timeout) {
    if (codec != "none") codec_ = comm::make_codec(codec);
  }
  int local_size() const { return local_ ? local_->size() : 1; }
  int local_rank() const { return local_ ? local_->rank() : 0; }

  // This rank's piece of `flat` (a copy, zero-padded to equal pieces).
  at::Tensor piece_of(const at::Tensor& flat) const {
    const int64_t chunk = (flat.numel() + local_size() - 1) / local_size();
    at::Tensor piece = at::zeros({chunk}, at::kFloat);
    const int64_t begin = std::min<int64_t>(flat.numel(), chunk * local_rank());
    const int64_t end = std::min<int64_t>(flat.numel(), begin + chunk);
    piece.slice(0, 0, end - begin).copy_(flat.slice(0, begin, end));
    return piece;
  }
  // Across clusters (may run on another thread than the training loop; uses only the cross group).
  void exchange(at::Tensor& piece, int64_t buffer_id) {
    if (!cross_) return;
    if (codec_) {
      auto st = comm::compressed_all_reduce(*cross_, piece, *codec_, &feedback_, buffer_id);
      bytes_ += st.bytes_sent;
    } else {
      cross_->all_reduce(piece, comm::ReduceOp::Avg)->wait(timeout_);
      bytes_ += 2 * (cross_->size() - 1) * 4 * piece.numel() / cross_->size();
    }
  }
  // Inside the cluster: every piece to every rank.
  void gather(at::Tensor& flat, const at::Tensor& piece) {
    if (!local_) {
      flat.copy_(piece.slice(0, 0, flat.numel()));
      return;
    }
    at::Tensor all = at::empty({piece.numel() * local_->size()}, at::kFloat);
    local_->all_gather(piece, all)->wait(timeout_);
    flat.copy_(all.slice(0, 0, flat.numel()));
  }
  void average(at::Tensor& flat, int64_t buffer_id) {
    at::Tensor piece = piece_of(flat);
    exchange(piece, buffer_id);
    gather(flat, piece);
  }
  int64_t bytes() const { return bytes_; }

 private:
  comm::Communicator* local_;
  comm::Communicator* cross_;
  comm::Millis timeout_;
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
  void attach(std::vector<at::Tensor> tensors, bool sharded, std::function<void()> changed) override {
    s_.parameters = std::move(tensors);
    sharded_ = sharded;
    changed_ = std::move(changed);
    attached();
  }
  void before_step(int64_t step) override {
    if (s_.config.slow_ms > 0 && s_.world_rank == s_.config.slow_rank)
      std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(1000 * s_.config.slow_ms)));
  }
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
  void set_tensors(const at::Tensor& flat) {
    unflatten(flat, s_.parameters);
    if (changed_) changed_();
  }
  virtual void attached() {}
  SyncSetup s_;
  ClusterGroups g_;
  bool sharded_ = false;
  std::function<void()> changed_;
  SyncStats stats_;
};

// ---- sync -------------------------------------------------------------------------------------------------

class SyncEveryStep : public StrategyBase {
 public:
  SyncEveryStep(SyncSetup s, ClusterGroups g)
      : StrategyBase(std::move(s), std::move(g)), average_(g_.local.get(), g_.cross.get(), "none", s_.timeout) {}
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

// ---- diloco (and streaming diloco) --------------------------------------------------------------------------

class DiLoCo : public StrategyBase {
 public:
  // Clusters that train on uneven shares of the batch (sync.cluster_batch) count by their share in the outer
  // average, so that every sequence counts the same, as in data parallelism: a cluster that processed 3x the
  // sequences brings 3x the evidence (with H = 1 and plain SGD inside, the weighted mean is exactly the
  // gradient of the whole global batch). An unweighted mean would give each sequence of the smaller share 3x
  // the say. Each cluster scales its own pseudo-gradient, so the exchange stays a plain mean.
  DiLoCo(SyncSetup s, ClusterGroups g)
      : StrategyBase(std::move(s), std::move(g)),
        weight_(outer_weight(parse_cluster_batch(s_.config.cluster_batch), g_.cluster)) {}

  // Fragments of the attached tensors, each with its outer momentum (kept as views per tensor for checkpoints).
  void attached() override {
    // Sharded tensors (ZeRO): each rank exchanges its own slices with its counterparts; nothing to gather.
    average_ = std::make_unique<CrossClusterAverage>(sharded_ ? nullptr : g_.local.get(), g_.cross.get(),
                                                     s_.config.compression, s_.timeout);
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

  double weight_;  // this cluster's pseudo-gradient factor in the outer mean (1: an even split)
  std::unique_ptr<CrossClusterAverage> average_;
  std::vector<Fragment> fragments_;
  std::vector<at::Tensor> momentum_views_, anchor_views_;
  int64_t pending_ = -1, pending_due_ = 0;
  std::future<void> exchange_;
};

// ---- gossip -----------------------------------------------------------------------------------------------

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

// ---- async and ssp (parameter server) ----------------------------------------------------------------------

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
};

}  // namespace

// ---- pure parts ---------------------------------------------------------------------------------------------

ClusterLayout cluster_layout(const std::vector<int>& ids) {
  ClusterLayout l;
  std::map<int, int> renumber;
  for (int id : ids) {
    auto it = renumber.find(id);
    if (it == renumber.end()) it = renumber.emplace(id, static_cast<int>(renumber.size())).first;
    l.cluster_of.push_back(it->second);
  }
  l.clusters = std::max<int>(1, static_cast<int>(renumber.size()));
  l.local.assign(l.clusters, {});
  for (size_t r = 0; r < l.cluster_of.size(); ++r) l.local[l.cluster_of[r]].push_back(static_cast<int>(r));
  for (const auto& g : l.local) l.balanced &= g.size() == l.local[0].size();
  if (l.balanced && !l.local.empty()) {
    for (size_t i = 0; i < l.local[0].size(); ++i) {
      l.cross.emplace_back();
      for (const auto& g : l.local) l.cross.back().push_back(g[i]);
    }
  }
  return l;
}

std::vector<int> block_clusters(int dp, int clusters) {
  if (clusters < 1 || dp % clusters != 0)
    throw UsageError("sync.clusters = " + std::to_string(clusters) + " must divide the " + std::to_string(dp) +
                     " data-parallel ranks");
  std::vector<int> ids;
  for (int r = 0; r < dp; ++r) ids.push_back(r / (dp / clusters));
  return ids;
}

std::vector<int64_t> rank_batches(const ClusterLayout& layout, const std::vector<int64_t>& cluster_batch,
                                  int64_t micro_batches) {
  if (cluster_batch.empty()) return {};
  std::string text;
  for (int64_t n : cluster_batch) text += (text.empty() ? "" : ",") + std::to_string(n);
  const std::string key = "sync.cluster_batch = \"" + text + "\"";
  if (static_cast<int>(cluster_batch.size()) != layout.clusters)
    throw UsageError(key + " gives " + std::to_string(cluster_batch.size()) + " counts but the job has " +
                     std::to_string(layout.clusters) +
                     " clusters (sync.clusters, sync.topology or CROSSTRAIN_CLUSTER); give one per cluster");
  std::vector<int64_t> out;
  for (int c : layout.cluster_of) {
    const auto ranks = static_cast<int64_t>(layout.local[c].size());
    if (cluster_batch[c] % (ranks * micro_batches) != 0)
      throw UsageError(key + ": cluster " + std::to_string(c) + "'s " + std::to_string(cluster_batch[c]) +
                       " sequences are not divisible by its " + std::to_string(ranks) + " data-parallel ranks x " +
                       std::to_string(micro_batches) + " micro-batches; use a multiple of " +
                       std::to_string(ranks * micro_batches));
    out.push_back(cluster_batch[c] / ranks);
  }
  return out;
}

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

int64_t fragment_offset(int64_t f, int64_t fragments, int64_t inner_steps) {
  return (f + 1) * inner_steps / fragments;
}

int cluster_from_environment() {
  for (const char* name : {"CROSSTRAIN_CLUSTER", "CT_CLUSTER"}) {
    const char* v = std::getenv(name);
    if (v && *v) {
      char* end = nullptr;
      long c = std::strtol(v, &end, 10);
      if (*end != '\0' || c < 0) throw UsageError(std::string(name) + " = '" + v + "' must be a cluster number (0, 1, ...)");
      return static_cast<int>(c);
    }
  }
  return -1;
}

int cluster_of_host(const comm::Topology& topology, const std::string& host, const std::string& origin) {
  std::vector<std::string> clusters;
  for (const auto& h : topology.hosts)
    if (std::find(clusters.begin(), clusters.end(), h.cluster) == clusters.end()) clusters.push_back(h.cluster);
  for (const auto& h : topology.hosts)
    if (h.name == host)
      return static_cast<int>(std::find(clusters.begin(), clusters.end(), h.cluster) - clusters.begin());
  std::string names;
  for (const auto& h : topology.hosts) names += (names.empty() ? "" : ", ") + h.name;
  throw UsageError("this host '" + host + "' is not listed in the topology " + origin + " (hosts: " + names +
                   "); add it, or set CROSSTRAIN_CLUSTER instead of sync.topology");
}

int cluster_of_this_node(const std::string& topology_path) {
  if (topology_path.empty()) return cluster_from_environment();
  char name[256] = {0};
  gethostname(name, sizeof name - 1);
  return cluster_of_host(comm::load_topology(topology_path), name, "'" + topology_path + "' (sync.topology)");
}

void check_sync_config(const SyncConfig& c, int dp, int pp, int tp, int64_t zero) {
  auto need = [](bool ok, const std::string& m) {
    if (!ok) throw UsageError(m);
  };
  const SyncMode m = c.mode;
  need(c.clusters >= 0, "sync.clusters must be 0 (from the environment) or more");
  need(c.clusters == 0 || dp % c.clusters == 0,
       "sync.clusters = " + std::to_string(c.clusters) + " must divide the " + std::to_string(dp) +
           " data-parallel ranks");
  need(c.inner_steps >= 1 && c.period >= 1, "sync.inner_steps and sync.period must be at least 1");
  need(c.fragments >= 1 && c.overlap_steps >= 0, "sync.fragments must be at least 1 and sync.overlap_steps at least 0");
  need(c.fragments == 1 || c.overlap_steps < c.inner_steps / c.fragments || c.overlap_steps == 0,
       "sync.overlap_steps = " + std::to_string(c.overlap_steps) + " must be less than inner_steps / fragments = " +
           std::to_string(c.inner_steps / c.fragments) + " (one fragment in flight at a time)");
  need(c.staleness >= 0, "sync.staleness must be at least 0");
  need(c.outer_lr > 0 && c.outer_momentum >= 0 && c.outer_momentum < 1,
       "sync.outer_lr must be positive and sync.outer_momentum in [0, 1)");
  if (c.compression != "none") comm::make_codec(c.compression);
  need(c.compression == "none" || m == SyncMode::DiLoCo, "sync.compression applies to sync.mode = \"diloco\"");
  need(!(m == SyncMode::Sync && c.hierarchical) || zero == 0,
       "sync.hierarchical averages whole gradients across clusters: set parallel.zero = 0 (layout dp=" +
           std::to_string(dp) + " x pp=" + std::to_string(pp) + " x tp=" + std::to_string(tp) + ", zero=" +
           std::to_string(zero) + "), or use sync.mode = \"diloco\", which runs with ZeRO inside each cluster");
}

namespace {
std::unique_ptr<SyncStrategy> build_strategy(SyncSetup s) {
  const SyncTraits traits = sync_traits(s.config);
  ClusterGroups g = build_groups(s, traits.cluster_groups);
  if (traits.cluster_groups && !g.layout.balanced) {
    std::string sizes;
    for (const auto& l : g.layout.local) sizes += (sizes.empty() ? "" : ", ") + std::to_string(l.size());
    throw UsageError(std::string("sync.mode = ") + to_string(s.config.mode) + " needs the same number of data-parallel ranks in every cluster; got " +
                     sizes);
  }
  switch (traits.mode) {
    case SyncMode::Sync: return std::make_unique<SyncEveryStep>(std::move(s), std::move(g));
    case SyncMode::DiLoCo: return std::make_unique<DiLoCo>(std::move(s), std::move(g));
    case SyncMode::Gossip: return std::make_unique<Gossip>(std::move(s), std::move(g));
    case SyncMode::Ssp:
    case SyncMode::Async: break;
  }
  std::unique_ptr<comm::Communicator> ps;
  if (s.dp) {
    std::vector<int> all(s.dp_size);
    for (int i = 0; i < s.dp_size; ++i) all[i] = i;
    ps = s.dp->split(all);
  }
  return std::make_unique<ServerSync>(std::move(s), std::move(g), std::move(ps));
}
}  // namespace

std::unique_ptr<SyncStrategy> make_sync_strategy(SyncSetup s) {
  std::vector<at::Tensor> now = std::move(s.parameters);
  s.parameters.clear();
  std::unique_ptr<SyncStrategy> strategy = build_strategy(std::move(s));
  if (!now.empty()) {
    strategy->attach(std::move(now), false, {});
    strategy->start(1);
  }
  return strategy;
}


}  // namespace crosstrain::train
