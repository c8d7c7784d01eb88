#include "crosstrain/parallel/zero.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {

void adamw_update(at::Tensor param, const at::Tensor& grad, at::Tensor exp_avg, at::Tensor exp_avg_sq, int64_t step,
                  const AdamWHyper& h, bool decay) {
  // Same operations in the same order as torch::optim::AdamW, so results match it bit for bit.
  if (decay && h.weight_decay != 0) param.mul_(1 - h.lr * h.weight_decay);
  const double bias_correction1 = 1 - std::pow(h.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(h.beta2, static_cast<double>(step));
  exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
  exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
  at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias_correction2)).add_(h.eps);
  param.addcdiv_(exp_avg, denom, -h.lr / bias_correction1);
}

int64_t zero_padded_size(int64_t numel, int ranks) {
  if (ranks < 1) throw UsageError("ZeRO needs at least one data-parallel rank");
  return (numel + ranks - 1) / ranks * ranks;
}

std::vector<OwnedPart> owned_parts(const std::vector<int64_t>& param_sizes, Range owned) {
  std::vector<OwnedPart> parts;
  int64_t offset = 0;
  for (size_t i = 0; i < param_sizes.size(); ++i) {
    const int64_t begin = std::max(offset, owned.begin), end = std::min(offset + param_sizes[i], owned.end);
    if (begin < end) parts.push_back({i, begin - offset, begin - owned.begin, end - begin});
    offset += param_sizes[i];
  }
  return parts;
}

namespace {

int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0; }

}  // namespace

ZeroOptimizer::ZeroOptimizer(std::vector<std::vector<ZeroParam>> units, comm::Communicator* dp, ZeroConfig config,
                             comm::Communicator* replicate)
    : comm_(dp), replicate_(replicate && replicate->size() > 1 ? replicate : nullptr), config_(config) {
  if (config_.stage < 1 || config_.stage > 3)
    throw UsageError("parallel.zero = " + std::to_string(config_.stage) + ": ZeRO stages are 1, 2 and 3 (0 is plain data parallel)");
  ranks_ = comm_ ? comm_->size() : 1;
  rank_ = comm_ ? comm_->rank() : 0;
  torch::autograd::AutoGradMode no_grad(false);
  for (auto& params : units) {
    if (params.empty()) continue;
    Unit u;
    u.params = std::move(params);
    for (auto& p : u.params) {
      if (p.tensor.scalar_type() != at::kFloat)
        throw UsageError("ZeRO takes fp32 parameters (it converts them for mixed precision); got a " +
                         std::string(c10::toString(p.tensor.scalar_type())) + " one");
      u.sizes.push_back(p.tensor.numel());
      u.numel += p.tensor.numel();
    }
    u.padded = zero_padded_size(u.numel, ranks_);
    u.shard = u.padded / ranks_;
    const Range owned{rank_ * u.shard, (rank_ + 1) * u.shard};
    u.parts = owned_parts(u.sizes, owned);
    // The master slice is taken from the fp32 values before the parameters are converted; in fp32 stages 1-2 it
    // is a view of the full buffer instead.
    const bool fp32 = config_.dtype == at::kFloat, own_master = !fp32 || config_.stage == 3;
    if (own_master) u.master = owned_values(u);
    u.full = at::zeros({u.padded}, at::TensorOptions().dtype(config_.dtype));
    rebind_parameters(u);
    if (!own_master) u.master = u.full.narrow(0, owned.begin, u.shard);
    if (!fp32 && config_.stage == 3) u.low = u.master.to(config_.dtype);
    u.exp_avg = at::zeros({u.shard}, at::kFloat);
    u.exp_avg_sq = at::zeros({u.shard}, at::kFloat);
    if (config_.stage == 1) {
      u.full_grads = at::zeros({u.padded}, at::TensorOptions().dtype(config_.dtype));
      u.grad_shard = u.full_grads.narrow(0, owned.begin, u.shard);
      int64_t offset = 0;
      for (size_t i = 0; i < u.params.size(); ++i) {
        u.grad_views.push_back(u.full_grads.narrow(0, offset, u.sizes[i]).view(u.params[i].tensor.sizes()));
        offset += u.sizes[i];
      }
    } else {
      u.grad_shard = at::zeros({u.shard}, at::TensorOptions().dtype(config_.dtype));
    }
    units_.push_back(std::move(u));
    // Stage 3 frees each full unit at once, so building never holds more than one beside the slices.
    if (config_.stage == 3) release(unit_count() - 1);
  }
  if (units_.empty()) throw UsageError("ZeRO got no parameters");
  side_ = at::zeros({kSideValues}, at::kDouble);
  attach_hooks();
  zero_grad();
  reset_pass();
}

// hooks_ goes first (declared last) and disarms the hooks that outlive us in the model's autograd graph.
ZeroOptimizer::~ZeroOptimizer() = default;

void ZeroOptimizer::attach_hooks() {
  std::vector<at::Tensor> params;
  std::vector<int> unit_of;  // parameter -> unit
  for (int ui = 0; ui < unit_count(); ++ui)
    for (auto& p : units_[ui].params) {
      params.push_back(p.tensor);
      unit_of.push_back(ui);
    }
  // A unit is reduced once all its gradients are in; what is left, at the end of backward.
  hooks_ = std::make_unique<GradientHooks>(
      params, [this, unit_of](size_t k) { return on_gradient_ready(unit_of[k]); }, [this] { finish(); });
}

at::Tensor ZeroOptimizer::owned_values(const Unit& u) const {
  at::Tensor values = at::zeros({u.shard}, at::kFloat);  // the padding stays zero
  for (const auto& part : u.parts)
    values.narrow(0, part.shard_offset, part.size)
        .copy_(u.params[part.param].tensor.detach().reshape(-1).narrow(0, part.param_offset, part.size));
  return values;
}

void ZeroOptimizer::rebind_parameters(Unit& u) {
  // The parameters become views of the unit's flat buffer. set_data keeps each parameter's own version
  // counter, so refilling the buffer (all-gather) does not look like an in-place change to autograd.
  int64_t offset = 0;
  for (size_t i = 0; i < u.params.size(); ++i) {
    at::Tensor& p = u.params[i].tensor;
    at::Tensor view = u.full.narrow(0, offset, u.sizes[i]).view(p.sizes());
    view.copy_(p.detach());
    p.set_data(view);  // also converts the parameter to the model's dtype
    offset += u.sizes[i];
  }
}

void ZeroOptimizer::allocate_full(Unit& u) {
  c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(u.padded) * u.full.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

void ZeroOptimizer::start_gather(int unit) {
  Unit& u = units_[unit];
  if (u.gathered != Gather::Released) return;
  allocate_full(u);
  const at::Tensor& source = u.low.defined() ? u.low : u.master;
  if (ranks_ > 1) {
    u.gather_work = comm_->all_gather(source, u.full);
    u.gathered = Gather::InFlight;
  } else {
    u.full.narrow(0, 0, u.shard).copy_(source);
    u.gathered = Gather::Ready;
  }
  gathered_peak_ = std::max(gathered_peak_, gathered_bytes());
}

void ZeroOptimizer::wait_gather(int unit) {
  Unit& u = units_[unit];
  if (u.gathered == Gather::InFlight) {
    u.gather_work->wait();
    u.gather_work.reset();
    u.gathered = Gather::Ready;
  }
}

void ZeroOptimizer::release(int unit) {
  if (config_.stage != 3) return;
  Unit& u = units_[unit];
  wait_gather(unit);
  // Frees the memory behind every parameter view of the unit; the views keep their shapes for the next gather.
  c10::StorageImpl* storage = u.full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, u.full.device()));
  storage->set_nbytes(0);
  u.gathered = Gather::Released;
}

int64_t ZeroOptimizer::gathered_bytes() const {
  int64_t bytes = 0;
  for (const auto& u : units_)
    if (u.gathered != Gather::Released) bytes += u.padded * static_cast<int64_t>(u.full.element_size());
  return bytes;
}

void ZeroOptimizer::before_unit(int unit) {
  if (config_.stage != 3) return;
  start_gather(unit);
  if (unit + 1 < unit_count()) start_gather(unit + 1);  // prefetch: overlaps the next gather with this compute
  wait_gather(unit);
}

at::Tensor ZeroOptimizer::after_unit(int unit, const at::Tensor& output) {
  if (config_.stage != 3) return output;
  if (output.requires_grad()) {
    // Runs when the gradient of the unit's output is complete, i.e. just before the unit's backward.
    hooks_->on_gradient(output, [this, unit] {
      start_gather(unit);
      if (unit > 0) start_gather(unit - 1);  // prefetch: backward goes to the previous unit next
      wait_gather(unit);
    });
    // The last unit's backward comes right after its forward: keep it.
    if (unit == unit_count() - 1) return output;
  }
  release(unit);
  return output;
}

void ZeroOptimizer::gather_all_parameters() {
  if (config_.stage != 3) return;
  for (int i = 0; i < unit_count(); ++i) start_gather(i);
  for (int i = 0; i < unit_count(); ++i) wait_gather(i);
}

void ZeroOptimizer::zero_grad() {
  for (auto& u : units_) {
    u.grad_shard.zero_();
    if (config_.stage == 1) {
      u.full_grads.zero_();
      for (size_t i = 0; i < u.params.size(); ++i) {
        at::Tensor& p = u.params[i].tensor;
        if (!p.grad().defined() || p.grad().data_ptr() != u.grad_views[i].data_ptr()) p.mutable_grad() = u.grad_views[i];
      }
    } else {
      for (auto& p : u.params) p.tensor.mutable_grad() = at::Tensor();
    }
  }
  side_.zero_();
}

void ZeroOptimizer::reset_pass() {
  for (auto& u : units_) {
    u.pending = static_cast<int>(u.params.size());
    u.work.reset();
    u.done = false;
  }
  next_launch_ = 0;
  hooks_->end_pass();
}

bool ZeroOptimizer::on_gradient_ready(int unit) {
  if (config_.stage == 1 && !sync_) return false;  // stage 1 accumulating: reduced by a later syncing pass
  --units_[unit].pending;
  launch_ready();
  return true;
}

void ZeroOptimizer::launch_ready() {
  // Backward produces the last unit's gradients first; launch strictly in that order on every rank.
  while (next_launch_ < units_.size()) {
    Unit& u = units_[units_.size() - 1 - next_launch_];
    if (u.pending > 0) break;
    ++next_launch_;
    launch(u);
  }
}

void ZeroOptimizer::launch(Unit& u) {
  u.launched = Clock::now();
  if (config_.stage == 1) {
    for (size_t i = 0; i < u.params.size(); ++i) {
      at::Tensor& p = u.params[i].tensor;
      if (p.grad().defined() && p.grad().data_ptr() != u.grad_views[i].data_ptr()) {
        u.grad_views[i].copy_(p.grad());
        p.mutable_grad() = u.grad_views[i];
      }
    }
    if (ranks_ > 1) u.work = comm_->all_reduce(u.full_grads, comm::ReduceOp::Avg);
  } else {
    absorb_finished_reductions(u);
    // Gather the fresh gradients into one buffer, drop the full ones, reduce-scatter to the owners.
    u.reduce_in = at::zeros({u.padded}, at::TensorOptions().dtype(config_.dtype));
    int64_t offset = 0;
    for (size_t i = 0; i < u.params.size(); ++i) {
      at::Tensor& p = u.params[i].tensor;
      if (p.grad().defined()) u.reduce_in.narrow(0, offset, u.sizes[i]).copy_(p.grad().reshape(-1));
      p.mutable_grad() = at::Tensor();
      offset += u.sizes[i];
    }
    if (ranks_ > 1) {
      u.reduce_out = at::empty({u.shard}, at::TensorOptions().dtype(config_.dtype));
      u.work = comm_->reduce_scatter(u.reduce_in, u.reduce_out, comm::ReduceOp::Avg);
    } else {
      u.reduce_out = u.reduce_in;
    }
    if (config_.stage == 3) release(static_cast<int>(&u - units_.data()));
  }
  if (!u.work) {
    u.done = true;
    u.completed = u.launched;
  }
}

void ZeroOptimizer::absorb_reduction(Unit& u) {
  if (!u.reduce_out.defined()) return;
  if (!u.done) {
    u.work->wait();
    u.done = true;
    u.completed = Clock::now();
  }
  average_over_copies(u.reduce_out);
  u.grad_shard.add_(u.reduce_out);
  u.reduce_in = u.reduce_out = at::Tensor();
}

void ZeroOptimizer::average_over_copies(at::Tensor& t) {
  if (replicate_) replicate_->all_reduce(t, comm::ReduceOp::Avg)->wait();
}

void ZeroOptimizer::absorb_finished_reductions(const Unit& next) {
  // Stages 2-3 would otherwise keep every unit's full-size reduction buffer until the end of backward: a whole
  // model's gradients, what ZeRO-2 exists to avoid. Finished ones are folded into the owned slices now; of those
  // still in flight only the last launched one stays (it overlaps the backward of the unit now launching), so
  // at most two units' buffers exist at once.
  // (A finished work still needs its wait(): the back end completes an average there.)
  const Unit* newest = nullptr;
  if (replicate_) {
    // Absorbing runs a collective over the copies (HSDP), so which units are absorbed must not depend on timing:
    // every one but the last launched (units launch in reverse order: the lowest index with a reduction).
    for (auto& u : units_)
      if (&u != &next && u.reduce_out.defined()) {
        newest = &u;
        break;
      }
    for (int i = unit_count() - 1; i >= 0; --i)
      if (&units_[i] != &next && &units_[i] != newest) absorb_reduction(units_[i]);
    return;
  }
  for (auto& u : units_) {
    if (&u == &next || !u.reduce_out.defined()) continue;
    if (u.done || u.work->is_completed()) absorb_reduction(u);
    else if (!newest || u.launched > newest->launched) newest = &u;
  }
  for (auto& u : units_)
    if (&u != &next && &u != newest) absorb_reduction(u);
}

void ZeroOptimizer::synchronize() {
  if (!hooks_->in_pass()) {
    if (config_.stage != 1) return;  // stages 2-3 reduced at the end of every backward already
    hooks_->begin_pass();
    for (auto& u : units_) u.launched = Clock::now();
  }
  finish();
}

void ZeroOptimizer::finish() {
  if (!hooks_->in_pass()) return;
  backward_done_ = Clock::now();
  stats_.started_during_backward = static_cast<int>(next_launch_);
  for (auto& u : units_) u.pending = 0;
  launch_ready();
  for (auto& u : units_) {
    if (config_.stage != 1) {
      absorb_reduction(u);
      continue;
    }
    if (!u.done) {
      u.work->wait();
      u.done = true;
      u.completed = Clock::now();
    }
    if (sync_) average_over_copies(u.grad_shard);
  }
  if (ranks_ > 1 && sync_) comm_->all_reduce(side_, comm::ReduceOp::Avg)->wait();
  if (sync_) average_over_copies(side_);
  std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals;  // in launch order: the last unit first
  stats_.bytes = stats_.bytes_sent = 0;
  for (int i = unit_count() - 1; i >= 0; --i) {
    const Unit& u = units_[i];
    intervals.emplace_back(u.launched, u.completed);
    const int64_t bytes = u.padded * static_cast<int64_t>(u.full.element_size());
    stats_.bytes += bytes;
    // Per rank: an all-reduce sends 2(N-1)/N of the buffer, a reduce-scatter (N-1)/N.
    if (ranks_ > 1) stats_.bytes_sent += (config_.stage == 1 ? 2 : 1) * (ranks_ - 1) * bytes / ranks_;
    // HSDP: the all-reduce of the owned slice over the copies.
    if (replicate_) stats_.bytes_sent += 2 * (replicate_->size() - 1) * (bytes / ranks_) / replicate_->size();
  }
  stats_.bytes_uncompressed = stats_.bytes_sent;
  stats_.buckets = unit_count();
  stats_.comm_time_s = busy_seconds(intervals);
  stats_.exposed_comm_time_s = ranks_ > 1 ? std::chrono::duration<double>(Clock::now() - backward_done_).count() : 0;
  reset_pass();
}

double ZeroOptimizer::owned_squared_norm(const std::function<bool(int, size_t)>& counted) const {
  double sum = 0;
  for (int ui = 0; ui < unit_count(); ++ui)
    for (const auto& part : units_[ui].parts)
      if (counted(ui, part.param))
        sum += units_[ui].grad_shard.narrow(0, part.shard_offset, part.size).pow(2).sum().item<double>();
  return sum;
}

double ZeroOptimizer::gradient_norm() const {
  at::Tensor sq = at::full({1}, owned_squared_norm([](int, size_t) { return true; }), at::kDouble);
  if (ranks_ > 1) comm_->all_reduce(sq, comm::ReduceOp::Sum)->wait();
  return std::sqrt(sq.item<double>());
}

void ZeroOptimizer::scale_gradients(double factor) {
  for (auto& u : units_) u.grad_shard.mul_(factor);
}

void ZeroOptimizer::all_reduce_owned_gradients(const std::function<bool(int, size_t)>& selected,
                                               comm::Communicator& group) {
  std::vector<at::Tensor> views;
  for (int ui = 0; ui < unit_count(); ++ui)
    for (const auto& part : units_[ui].parts)
      if (selected(ui, part.param)) views.push_back(units_[ui].grad_shard.narrow(0, part.shard_offset, part.size));
  if (views.empty() || group.size() == 1) return;
  at::Tensor flat = at::cat(views);
  group.all_reduce(flat, comm::ReduceOp::Sum)->wait();
  int64_t offset = 0;
  for (auto& v : views) {
    v.copy_(flat.narrow(0, offset, v.numel()));
    offset += v.numel();
  }
}

void ZeroOptimizer::set_side_value(int index, double value) {
  if (index < 0 || index >= kSideValues) throw UsageError("side value index out of range");
  side_[index].fill_(value);
}

double ZeroOptimizer::side_value(int index) const { return side_[index].item<double>(); }

void ZeroOptimizer::step(double lr) {
  ++step_count_;
  AdamWHyper h = config_.adam;
  h.lr = lr;
  AdamWHyper no_decay = h;
  no_decay.weight_decay = 0;
  for (auto& u : units_) {
    // Decoupled decay on the parts of decayed parameters, then Adam on the whole owned slice.
    if (h.weight_decay != 0)
      for (const auto& part : u.parts)
        if (u.params[part.param].decay) u.master.narrow(0, part.shard_offset, part.size).mul_(1 - h.lr * h.weight_decay);
    adamw_update(u.master, u.grad_shard.scalar_type() == at::kFloat ? u.grad_shard : u.grad_shard.to(at::kFloat),
                 u.exp_avg, u.exp_avg_sq, step_count_, no_decay, false);
  }
  master_weights_changed();
}

void ZeroOptimizer::master_weights_changed() {
  const bool fp32 = config_.dtype == at::kFloat;
  for (auto& u : units_) {
    if (!fp32 && config_.stage < 3) u.full.narrow(0, rank_ * u.shard, u.shard).copy_(u.master);
    if (u.low.defined()) u.low.copy_(u.master);
  }
  if (config_.stage == 3 || ranks_ == 1) return;
  std::vector<comm::WorkPtr> works;
  std::vector<at::Tensor> inputs;
  for (auto& u : units_) {
    inputs.push_back(u.full.narrow(0, rank_ * u.shard, u.shard).clone());  // it lives inside the output: send a copy
    works.push_back(comm_->all_gather(inputs.back(), u.full));
  }
  comm::wait_all(works);
}

ModelStateBytes ZeroOptimizer::memory() const {
  ModelStateBytes m;
  for (const auto& u : units_) {
    const bool fp32 = config_.dtype == at::kFloat;
    m.parameters += config_.stage < 3 ? nbytes(u.full) : fp32 ? nbytes(u.master) : nbytes(u.low);
    m.gradients += config_.stage == 1 ? nbytes(u.full_grads) : nbytes(u.grad_shard);
    m.optimizer += nbytes(u.exp_avg) + nbytes(u.exp_avg_sq) + (fp32 ? 0 : nbytes(u.master));
  }
  // What is gathered now counts too: a unit that is never released shows, not only the gathers' high-water mark.
  m.gathered_peak = config_.stage == 3 ? std::max(gathered_peak_, gathered_bytes()) : 0;
  return m;
}

std::vector<at::Tensor> ZeroOptimizer::state_tensors() {
  std::vector<at::Tensor> out;
  for (auto& u : units_) {
    out.push_back(u.master);
    out.push_back(u.exp_avg);
    out.push_back(u.exp_avg_sq);
  }
  return out;
}

std::vector<ZeroOptimizer::OwnedSlice> ZeroOptimizer::owned_slices() {
  std::vector<OwnedSlice> out;
  for (int ui = 0; ui < unit_count(); ++ui) {
    Unit& u = units_[ui];
    for (const auto& part : u.parts)
      out.push_back({ui, part.param, u.params[part.param].tensor, part.param_offset,
                     u.master.narrow(0, part.shard_offset, part.size), u.exp_avg.narrow(0, part.shard_offset, part.size),
                     u.exp_avg_sq.narrow(0, part.shard_offset, part.size)});
  }
  return out;
}

}  // namespace crosstrain::parallel
