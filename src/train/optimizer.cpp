#include "crosstrain/train/optimizer.h"

#include <torch/torch.h>

#include <cmath>
#include <set>

#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace {

// ---- checkpoint pieces, shared by both optimizers -------------------------------------------------------

const std::vector<int64_t>& global_shape_of(const StatePlacement& w, const std::string& name) {
  auto it = w.global_shapes.find(name);
  if (it == w.global_shapes.end()) throw Error("checkpoint: no global shape for parameter '" + name + "'");
  return it->second;
}

// A parameter is split over the tensor-parallel group when its shard is smaller than the whole.
bool is_split(const StatePlacement& w, const std::string& name, const at::Tensor& shard) {
  return w.tp_size > 1 && shard.sizes().vec() != global_shape_of(w, name);
}

std::string copy_name(const std::string& tensor, int copy) {
  return copy == 0 ? tensor : tensor + "#copy" + std::to_string(copy);
}

checkpoint::Piece piece(const std::string& tensor, const std::string& param, const at::Tensor& shard,
                        const StatePlacement& w, int64_t offset, const at::Tensor& data) {
  const bool split = is_split(w, param, shard);
  checkpoint::Piece p;
  p.tensor = copy_name(tensor, w.copy);
  p.param = param;
  p.global_shape = global_shape_of(w, param);
  p.shard_shape = shard.sizes().vec();
  p.tp_rank = split ? w.tp_rank : 0;
  p.tp_size = split ? w.tp_size : 1;
  p.offset = offset;
  p.data = data.detach().reshape(-1).clone();  // a snapshot: training may change the original right away
  return p;
}

// Everything is checked before anything is changed: every tensor exists with this model's shape.
void check_has(checkpoint::CheckpointReader& reader, const StatePlacement& w,
               const std::map<std::string, at::Tensor>& params) {
  const std::string manifest = reader.dir() + "/manifest.json";
  for (const auto& [name, t] : params) {
    for (const std::string& tensor : {name, name + "#exp_avg", name + "#exp_avg_sq"})
      if (!reader.has(tensor))
        throw UsageError("checkpoint '" + reader.dir() + "' has no tensor '" + tensor + "' (" + manifest +
                         "): it was written for another model");
    const auto& global = global_shape_of(w, name);
    if (reader.global_shape(name) != global)
      throw UsageError("checkpoint '" + reader.dir() + "': parameter '" + name + "' has shape " +
                       c10::str(c10::IntArrayRef(reader.global_shape(name))) + " in " + manifest +
                       " but this model's is " + c10::str(c10::IntArrayRef(global)) +
                       ": it was written for another model configuration");
  }
}

// This rank's shard of a saved tensor (undefined when an optional tensor is absent: the caller keeps its own).
at::Tensor read_shard(checkpoint::CheckpointReader& reader, const StatePlacement& w, const std::string& param,
                      const std::string& tensor, const at::Tensor& like, bool optional = false) {
  if (optional && !reader.has(tensor)) return at::Tensor();
  const std::string own = copy_name(tensor, w.copy);
  const std::string& stored = reader.has(own) ? own : tensor;
  at::Tensor shard = w.split(param, reader.read_full(stored, w.split), w.tp_rank, w.tp_size).contiguous();
  if (shard.sizes() != like.sizes())
    throw UsageError("checkpoint '" + reader.dir() + "': parameter '" + param + "' splits into " +
                     c10::str(shard.sizes()) + " but this rank holds " + c10::str(like.sizes()));
  return shard;
}

std::string key_of(const at::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// ---- replicated AdamW -------------------------------------------------------------------------------------

class ReplicatedAdamW : public ModelOptimizer {
 public:
  // With a low-precision dtype the model's parameters and gradients become that dtype and AdamW steps fp32
  // master copies (mixed precision, like ZeRO's bf16 mode without the sharding). The reducer averages the bf16
  // gradients in fp32, and each master's .grad is a view of that fp32 result: the norm, clipping, a
  // cross-cluster average (hierarchical sync) and AdamW all read and write fp32, with no per-step copy.
  ReplicatedAdamW(const std::vector<std::vector<NamedParameter>>& units, comm::Communicator* group,
                  const OptimizerConfig& c)
      : mixed_(c.dtype != at::kFloat) {
    std::vector<torch::Tensor> decay, no_decay, all;
    for (const auto& unit : units)
      for (const auto& p : unit) {
        at::Tensor master = p.tensor;
        if (mixed_) {
          torch::NoGradGuard no_grad;
          master = p.tensor.detach().clone();
          const_cast<at::Tensor&>(p.tensor).set_data(p.tensor.data().to(c.dtype));
        }
        (p.tensor.dim() >= 2 ? decay : no_decay).push_back(master);
        all.push_back(p.tensor);
        params_[p.name] = p.tensor;
        masters_[p.name] = master;
        name_of_[p.tensor.unsafeGetTensorImpl()] = p.name;
      }
    auto options = [&](double wd) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(c.adam.lr).betas({c.adam.beta1, c.adam.beta2}).eps(c.adam.eps).weight_decay(wd));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decay, options(c.adam.weight_decay));
    if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
    adamw_ = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(c.adam.lr));
    parallel::BucketConfig buckets;
    buckets.bucket_bytes = c.bucket_bytes;
    buckets.compression = c.compression;
    reducer_ = std::make_unique<parallel::BucketedAllReduce>(all, group, buckets);
    if (mixed_)
      for (auto& [name, master] : masters_) master.mutable_grad() = reducer_->reduced_gradient(params_.at(name));
  }
  std::string describe() const override {
    return std::string(mixed_ ? "AdamW with fp32 master weights" : "AdamW") + " on every replica, " +
           std::to_string(reducer_->bucket_count()) + (reducer_->bucket_count() == 1 ? " gradient bucket" : " gradient buckets");
  }
  parallel::GradReducer& reducer() override { return *reducer_; }
  void step(double lr) override {
    for (auto& g : adamw_->param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    adamw_->step();
    if (mixed_) sync_tensors_changed();
  }
  // The reduced gradients are the masters' (fp32; the parameters' own with fp32 training).
  void sum_partial_gradients(const std::vector<at::Tensor>& partial, comm::Communicator& tp) override {
    for (const auto& p : partial) {
      at::Tensor& reduced = masters_.at(name_of_.at(p.unsafeGetTensorImpl())).mutable_grad();
      at::Tensor g = reduced.contiguous();
      tp.all_reduce(g, comm::ReduceOp::Sum)->wait();
      reduced.copy_(g);
    }
  }
  double gradient_norm(const std::function<bool(const std::string&)>& counted, comm::Communicator* replica) override {
    if (!replica) return reducer_->gradient_norm();  // one rank per replica: the flat buckets are the model
    double sq = 0;
    for (const auto& [name, t] : masters_)
      if (counted(name) && t.grad().defined()) sq += t.grad().to(at::kFloat).pow(2).sum().item<double>();
    at::Tensor total = at::full({1}, sq, at::kDouble);
    replica->all_reduce(total, comm::ReduceOp::Sum)->wait();
    return std::sqrt(total.item<double>());
  }
  parallel::ModelStateBytes memory() const override {
    parallel::ModelStateBytes m;
    for (const auto& [name, t] : params_) m.parameters += t.numel() * static_cast<int64_t>(t.element_size());
    if (mixed_)  // the fp32 masters; the gradients: the local bf16 ones and the fp32 reduced ones AdamW reads
      for (const auto& [name, t] : masters_) m.optimizer += t.numel() * static_cast<int64_t>(t.element_size());
    m.gradients += reducer_->stats().bytes + reducer_->local_gradient_bytes();
    for (const auto& [key, st] : adamw_->state()) {
      auto& a = static_cast<torch::optim::AdamWParamState&>(*st);
      for (const auto& t : {a.exp_avg(), a.exp_avg_sq()})
        if (t.defined()) m.optimizer += t.numel() * static_cast<int64_t>(t.element_size());
    }
    return m;
  }
  std::map<std::string, at::Tensor> gradients() const override {
    std::map<std::string, at::Tensor> g;
    for (const auto& [name, t] : masters_)
      if (t.grad().defined()) g[name] = t.grad().clone();
    return g;
  }
  // The fp32 masters (the parameters themselves in fp32), in name order: a layer's tensors stay together.
  std::vector<at::Tensor> sync_tensors() override {
    std::vector<at::Tensor> all;
    for (const auto& [name, t] : masters_) all.push_back(t);
    return all;
  }
  bool sync_tensors_sharded() const override { return false; }
  void sync_tensors_changed() override {
    if (!mixed_) return;
    torch::NoGradGuard no_grad;
    for (auto& [name, t] : params_) t.copy_(masters_.at(name));
  }

  std::vector<checkpoint::Piece> checkpoint_pieces(const StatePlacement& w, const std::vector<ExtraState>& extra) override {
    torch::NoGradGuard no_grad;
    std::vector<checkpoint::Piece> pieces;
    size_t index = 0;
    for (const auto& [name, t] : masters_) {
      const size_t i = index++;
      if (!is_split(w, name, t) && w.tp_rank != 0) continue;  // replicated: tensor-parallel rank 0 writes it
      // Each writer of the copy writes an even share of the (identical) replicas.
      const int64_t n = t.numel(), begin = w.writer * n / w.writers, end = (w.writer + 1) * n / w.writers;
      if (begin == end) continue;
      auto part = [&](const at::Tensor& x) { return x.reshape(-1).narrow(0, begin, end - begin); };
      auto [m, v] = moments(t);
      pieces.push_back(piece(name, name, t, w, begin, part(t.detach())));
      pieces.push_back(piece(name + "#exp_avg", name, t, w, begin, part(m)));
      pieces.push_back(piece(name + "#exp_avg_sq", name, t, w, begin, part(v)));
      for (const auto& e : extra) pieces.push_back(piece(name + e.suffix, name, t, w, begin, part(e.tensors[i])));
    }
    return pieces;
  }
  void load(checkpoint::CheckpointReader& reader, const StatePlacement& w, const std::vector<ExtraState>& extra) override {
    check_has(reader, w, masters_);
    struct Loaded {
      at::Tensor value, exp_avg, exp_avg_sq;
      std::vector<at::Tensor> extra;
    };
    std::vector<Loaded> loaded;
    for (const auto& [name, t] : masters_) {
      Loaded l{read_shard(reader, w, name, name, t), read_shard(reader, w, name, name + "#exp_avg", t),
               read_shard(reader, w, name, name + "#exp_avg_sq", t), {}};
      for (const auto& e : extra) l.extra.push_back(read_shard(reader, w, name, name + e.suffix, t, true));
      loaded.push_back(std::move(l));
    }
    const int64_t optimizer_step = reader.info().value("optimizer_step", reader.info().value("step", int64_t{0}));
    torch::NoGradGuard no_grad;
    size_t i = 0;
    for (const auto& [name, t] : masters_) {
      const Loaded& l = loaded[i];
      const_cast<torch::Tensor&>(t).copy_(l.value);
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(optimizer_step);
      st->exp_avg(l.exp_avg.view(t.sizes()).clone());
      st->exp_avg_sq(l.exp_avg_sq.view(t.sizes()).clone());
      adamw_->state()[key_of(t)] = std::move(st);
      for (size_t k = 0; k < extra.size(); ++k)
        if (l.extra[k].defined()) extra[k].tensors[i].copy_(l.extra[k].view_as(extra[k].tensors[i]));
      ++i;
    }
    sync_tensors_changed();
  }
  int64_t step_count() const override {
    for (const auto& [key, st] : adamw_->state()) return static_cast<torch::optim::AdamWParamState&>(*st).step();
    return 0;
  }
  std::vector<at::Tensor> live_state() override {
    std::vector<at::Tensor> out;
    const int64_t steps = step_count();
    for (const auto& [name, t] : masters_) {
      // torch creates a parameter's state at its first step; zero moments at step 0 are what it would create.
      auto& slot = adamw_->state()[key_of(t)];
      if (!slot) {
        auto st = std::make_unique<torch::optim::AdamWParamState>();
        st->step(steps);
        st->exp_avg(torch::zeros_like(t, at::MemoryFormat::Preserve));
        st->exp_avg_sq(torch::zeros_like(t, at::MemoryFormat::Preserve));
        slot = std::move(st);
      }
      auto& st = static_cast<torch::optim::AdamWParamState&>(*slot);
      out.push_back(t.detach());
      out.push_back(st.exp_avg());
      out.push_back(st.exp_avg_sq());
    }
    return out;
  }
  void set_step_count(int64_t steps) override {
    live_state();  // every parameter has its state
    for (auto& [key, st] : adamw_->state()) static_cast<torch::optim::AdamWParamState&>(*st).step(steps);
  }

 private:
  std::pair<at::Tensor, at::Tensor> moments(const at::Tensor& t) const {
    auto it = adamw_->state().find(key_of(t));
    if (it == adamw_->state().end()) return {at::zeros_like(t), at::zeros_like(t)};
    auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
    return {st.exp_avg(), st.exp_avg_sq()};
  }

  bool mixed_;
  std::map<std::string, at::Tensor> params_;   // the model's (bf16 with mixed precision)
  std::map<std::string, at::Tensor> masters_;  // what AdamW steps: fp32 (the parameters themselves in fp32)
  std::map<const c10::TensorImpl*, std::string> name_of_;  // the model's parameters
  std::unique_ptr<torch::optim::AdamW> adamw_;
  std::unique_ptr<parallel::BucketedAllReduce> reducer_;
};

// ---- ZeRO's sharded AdamW ---------------------------------------------------------------------------------

class ShardedAdamW : public ModelOptimizer {
 public:
  ShardedAdamW(const std::vector<std::vector<NamedParameter>>& units, comm::Communicator* group,
               const OptimizerConfig& c, comm::Communicator* copies)
      : group_(group && group->size() > 1 ? group : nullptr), copies_(copies && copies->size() > 1 ? copies : nullptr) {
    std::vector<std::vector<parallel::ZeroParam>> zero_units;
    for (const auto& unit : units) {
      names_.emplace_back();
      zero_units.emplace_back();
      for (const auto& p : unit) {
        names_.back().push_back(p.name);
        zero_units.back().push_back({p.tensor, p.tensor.dim() >= 2});
        params_[p.name] = p.tensor;
      }
    }
    parallel::ZeroConfig zc;
    zc.stage = c.zero;
    zc.adam = c.adam;
    zc.dtype = c.dtype;
    zero_ = std::make_unique<parallel::ZeroOptimizer>(std::move(zero_units), group_, zc, copies_);
    for (const auto& [name, t] : params_) name_of_[t.unsafeGetTensorImpl()] = name;
  }
  std::string describe() const override {
    return "ZeRO-" + std::to_string(zero_->stage()) + " over " + std::to_string(group_ ? group_->size() : 1) +
           " data-parallel ranks" + (copies_ ? " x " + std::to_string(copies_->size()) + " copies (HSDP)" : "") +
           ", " + std::to_string(zero_->unit_count()) + " units";
  }
  parallel::GradReducer& reducer() override { return *zero_; }
  parallel::UnitHooks* unit_hooks() override { return zero_->stage() == 3 ? zero_.get() : nullptr; }
  void gather_parameters() override {
    if (zero_->stage() == 3) zero_->gather_all_parameters();
  }
  void step(double lr) override { zero_->step(lr); }
  void sum_partial_gradients(const std::vector<at::Tensor>& partial, comm::Communicator& tp) override {
    std::set<std::string> selected;
    for (const auto& p : partial) selected.insert(name_of_.at(p.unsafeGetTensorImpl()));
    zero_->all_reduce_owned_gradients([&](int u, size_t i) { return selected.count(names_[u][i]) > 0; }, tp);
  }
  double gradient_norm(const std::function<bool(const std::string&)>& counted, comm::Communicator* replica) override {
    // The data-parallel ranks own disjoint slices: summed over them (and the replica) every element counts once.
    at::Tensor sq = at::full({1}, zero_->owned_squared_norm([&](int u, size_t i) { return counted(names_[u][i]); }),
                             at::kDouble);
    if (group_) group_->all_reduce(sq, comm::ReduceOp::Sum)->wait();
    if (replica) replica->all_reduce(sq, comm::ReduceOp::Sum)->wait();
    return std::sqrt(sq.item<double>());
  }
  parallel::ModelStateBytes memory() const override { return zero_->memory(); }
  std::map<std::string, at::Tensor> gradients() const override { return {}; }
  std::vector<at::Tensor> sync_tensors() override {
    std::vector<at::Tensor> all;
    for (auto& slice : zero_->owned_slices()) all.push_back(slice.value);
    return all;
  }
  bool sync_tensors_sharded() const override { return group_ != nullptr; }
  void sync_tensors_changed() override { zero_->master_weights_changed(); }

  std::vector<checkpoint::Piece> checkpoint_pieces(const StatePlacement& w, const std::vector<ExtraState>& extra) override {
    torch::NoGradGuard no_grad;
    std::vector<checkpoint::Piece> pieces;
    if (copies_ && copies_->rank() != 0) return pieces;  // HSDP: the first copy writes the state
    size_t i = 0;
    for (auto& slice : zero_->owned_slices()) {
      const size_t index = i++;
      const std::string& name = name_of_.at(slice.tensor.unsafeGetTensorImpl());
      if (!is_split(w, name, slice.tensor) && w.tp_rank != 0) continue;  // replicated: tp rank 0 writes it
      pieces.push_back(piece(name, name, slice.tensor, w, slice.param_offset, slice.value));
      pieces.push_back(piece(name + "#exp_avg", name, slice.tensor, w, slice.param_offset, slice.exp_avg));
      pieces.push_back(piece(name + "#exp_avg_sq", name, slice.tensor, w, slice.param_offset, slice.exp_avg_sq));
      for (const auto& e : extra)
        pieces.push_back(piece(name + e.suffix, name, slice.tensor, w, slice.param_offset, e.tensors[index]));
    }
    return pieces;
  }
  void load(checkpoint::CheckpointReader& reader, const StatePlacement& w, const std::vector<ExtraState>& extra) override {
    check_has(reader, w, params_);
    std::map<std::string, std::vector<at::Tensor>> full;  // value, moments, extras: this rank's shard, flat
    for (const auto& [name, t] : params_) {
      auto& f = full[name];
      for (const std::string suffix : {"", "#exp_avg", "#exp_avg_sq"})
        f.push_back(read_shard(reader, w, name, name + suffix, t).reshape(-1));
      for (const auto& e : extra) {
        at::Tensor x = read_shard(reader, w, name, name + e.suffix, t, true);
        f.push_back(x.defined() ? x.reshape(-1) : x);
      }
    }
    torch::NoGradGuard no_grad;
    // Stages 1-2 hold whole parameters; stage 3 only its slices (the parameter memory is released).
    if (zero_->stage() < 3)
      for (const auto& [name, t] : params_) const_cast<at::Tensor&>(t).copy_(full[name][0].view(t.sizes()));
    size_t i = 0;
    for (auto& slice : zero_->owned_slices()) {
      const auto& f = full[name_of_.at(slice.tensor.unsafeGetTensorImpl())];
      const int64_t n = slice.value.numel();
      slice.value.copy_(f[0].narrow(0, slice.param_offset, n));
      slice.exp_avg.copy_(f[1].narrow(0, slice.param_offset, n));
      slice.exp_avg_sq.copy_(f[2].narrow(0, slice.param_offset, n));
      for (size_t k = 0; k < extra.size(); ++k)
        if (f[3 + k].defined()) extra[k].tensors[i].copy_(f[3 + k].narrow(0, slice.param_offset, n));
      ++i;
    }
    zero_->set_step_count(reader.info().value("optimizer_step", reader.info().value("step", int64_t{0})));
    zero_->master_weights_changed();
  }
  int64_t step_count() const override { return zero_->step_count(); }
  std::vector<at::Tensor> live_state() override { return zero_->state_tensors(); }
  void set_step_count(int64_t steps) override { zero_->set_step_count(steps); }

 private:
  comm::Communicator* group_;
  comm::Communicator* copies_;  // HSDP
  std::vector<std::vector<std::string>> names_;  // per unit
  std::map<std::string, at::Tensor> params_;
  std::map<const c10::TensorImpl*, std::string> name_of_;
  std::unique_ptr<parallel::ZeroOptimizer> zero_;
};

}  // namespace

std::unique_ptr<ModelOptimizer> make_optimizer(const std::vector<std::vector<NamedParameter>>& units,
                                               comm::Communicator* group, const OptimizerConfig& config,
                                               comm::Communicator* copies) {
  if (config.zero == 0) return std::make_unique<ReplicatedAdamW>(units, group, config);
  return std::make_unique<ShardedAdamW>(units, group, config, copies);
}

}  // namespace crosstrain::train
