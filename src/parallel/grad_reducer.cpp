#include "crosstrain/parallel/grad_reducer.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {

double busy_seconds(const std::vector<std::pair<std::chrono::steady_clock::time_point,
                                                std::chrono::steady_clock::time_point>>& intervals) {
  double busy = 0;
  std::chrono::steady_clock::time_point covered{};
  for (const auto& [launched, completed] : intervals) {
    const auto start = std::max(launched, covered);
    if (completed > start) busy += std::chrono::duration<double>(completed - start).count();
    covered = std::max(covered, completed);
  }
  return busy;
}

BucketedAllReduce::BucketedAllReduce(std::vector<at::Tensor> parameters, comm::Communicator* comm,
                                     BucketConfig config)
    : comm_(comm) {
  for (auto& p : parameters)
    if (p.requires_grad()) parameters_.push_back(p);
  if (config.bucket_bytes < 1) throw UsageError("parallel.bucket_mb must be positive");
  if (config.compression != "none") codec_ = comm::make_codec(config.compression);
  bucket_of_.resize(parameters_.size());
  // Reverse order: the last layers' gradients are ready first.
  for (size_t k = parameters_.size(); k-- > 0;) {
    const at::Tensor& p = parameters_[k];
    const int64_t bytes = p.numel() * static_cast<int64_t>(p.element_size());
    if (buckets_.empty()) buckets_.emplace_back();
    Bucket& b = buckets_.back();
    int64_t used = 0;
    for (size_t q : b.params) used += parameters_[q].numel() * static_cast<int64_t>(parameters_[q].element_size());
    const bool same_dtype = b.params.empty() || parameters_[b.params[0]].scalar_type() == p.scalar_type();
    if (!b.params.empty() && (!same_dtype || used + bytes > config.bucket_bytes)) buckets_.emplace_back();
    buckets_.back().params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
  }
  if (buckets_.empty()) throw UsageError("the gradient reducer got no parameters that require gradients");
  for (auto& b : buckets_) {
    int64_t numel = 0;
    for (size_t q : b.params) numel += parameters_[q].numel();
    // The bucket started last also carries the side values.
    const int64_t side = &b == &buckets_.back() ? kSideValues : 0;
    b.flat = at::zeros({numel + side}, parameters_[b.params[0]].options().requires_grad(false));
    b.grads = b.flat.narrow(0, 0, numel);
    // bf16 gradients are summed in fp32: a bf16 sum would round at every hop, and the optimizer wants fp32.
    const bool low = b.flat.scalar_type() == at::kBFloat16 || b.flat.scalar_type() == at::kHalf;
    b.wide = low ? at::zeros({numel + side}, b.flat.options().dtype(at::kFloat)) : b.flat;
    b.wide_grads = b.wide.narrow(0, 0, numel);
    int64_t offset = 0;
    for (size_t q : b.params) {
      const at::Tensor& p = parameters_[q];
      b.views.push_back(b.flat.narrow(0, offset, p.numel()).view(p.sizes()));
      b.wide_views.push_back(b.wide.narrow(0, offset, p.numel()).view(p.sizes()));
      offset += p.numel();
    }
    stats_.bytes += numel * static_cast<int64_t>(b.wide.element_size());
  }
  stats_.buckets = static_cast<int>(buckets_.size());
  attach_views();
  // At the end of a syncing backward: start what is left and wait.
  hooks_ = std::make_unique<GradientHooks>(
      parameters_, [this](size_t k) { return on_gradient_ready(k); }, [this] { finish(); });
  reset_pass();
}

// hooks_ goes first (declared last) and disarms the hooks that outlive us in the model's autograd graph.
BucketedAllReduce::~BucketedAllReduce() = default;

void BucketedAllReduce::attach_views() {
  for (auto& b : buckets_)
    for (size_t i = 0; i < b.params.size(); ++i) {
      at::Tensor& p = parameters_[b.params[i]];
      const at::Tensor& view = b.views[i];
      if (!p.grad().defined() || p.grad().data_ptr() != view.data_ptr()) {
        if (p.grad().defined()) view.copy_(p.grad());
        p.mutable_grad() = view;
      }
    }
}

void BucketedAllReduce::zero_grad() {
  for (auto& b : buckets_) b.flat.zero_();
  attach_views();
}

// On the reduced gradients, which are fp32 whatever the model's dtype.
double BucketedAllReduce::gradient_norm() const {
  double sum = 0;
  for (const auto& b : buckets_) sum += b.wide_grads.pow(2).sum().item<double>();
  return std::sqrt(sum);
}

void BucketedAllReduce::scale_gradients(double factor) {
  for (auto& b : buckets_) b.wide_grads.mul_(factor);
}

at::Tensor BucketedAllReduce::reduced_gradient(const at::Tensor& parameter) const {
  for (const auto& b : buckets_)
    for (size_t i = 0; i < b.params.size(); ++i)
      if (parameters_[b.params[i]].is_same(parameter)) return b.wide_views[i];
  throw Error("reduced_gradient: the parameter is not one of this reducer's (a bug in the caller)");
}

int64_t BucketedAllReduce::local_gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& b : buckets_)
    if (!b.wide.is_same(b.flat)) bytes += b.grads.numel() * static_cast<int64_t>(b.flat.element_size());
  return bytes;
}

// The side values live in the reduced (fp32) buffer: a bf16 bucket would round the loss to 3 digits.
void BucketedAllReduce::set_side_value(int index, double value) {
  if (index < 0 || index >= kSideValues) throw UsageError("side value index out of range");
  const at::Tensor& wide = buckets_.back().wide;
  wide[wide.numel() - kSideValues + index].fill_(value);
}

double BucketedAllReduce::side_value(int index) const {
  const at::Tensor& wide = buckets_.back().wide;
  return wide[wide.numel() - kSideValues + index].item<double>();
}

void BucketedAllReduce::reset_pass() {
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.work.reset();
    b.done = false;
  }
  next_launch_ = 0;
  hooks_->end_pass();
}

bool BucketedAllReduce::on_gradient_ready(size_t param) {
  if (!sync_) return false;  // accumulating: a later syncing pass or synchronize() starts the bucket
  --buckets_[bucket_of_[param]].pending;
  launch_ready_buckets();
  return true;
}

void BucketedAllReduce::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same sequence of collectives.
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending <= 0) launch(buckets_[next_launch_++]);
  // Note completions as they happen, for the comm-time accounting.
  for (size_t i = 0; i < next_launch_; ++i) {
    Bucket& b = buckets_[i];
    if (!b.done && b.work && b.work->is_completed()) {
      b.work->wait();
      b.done = true;
      b.completed = Clock::now();
    }
  }
}

void BucketedAllReduce::launch(Bucket& b) {
  b.launched = Clock::now();
  // A gradient replaced behind our back (someone assigned .grad) is copied back into the bucket.
  for (size_t i = 0; i < b.params.size(); ++i) {
    at::Tensor& p = parameters_[b.params[i]];
    if (p.grad().defined() && p.grad().data_ptr() != b.views[i].data_ptr()) {
      b.views[i].copy_(p.grad());
      p.mutable_grad() = b.views[i];
    }
  }
  if (!b.wide.is_same(b.flat)) b.wide_grads.copy_(b.grads);  // widened once; the side values are already there
  if (comm_ && comm_->size() > 1 && !codec_) {
    b.work = comm_->all_reduce(b.wide, comm::ReduceOp::Avg);
  } else if (comm_ && comm_->size() > 1) {
    // Compressed: exchanged in finish(), in bucket order.
  } else {
    b.done = true;
    b.completed = b.launched;
  }
}

void BucketedAllReduce::synchronize() {
  if (!hooks_->in_pass()) {
    hooks_->begin_pass();
    for (auto& b : buckets_) b.launched = Clock::now();
  }
  finish();
}

void BucketedAllReduce::finish() {
  if (!hooks_->in_pass()) return;
  backward_done_ = Clock::now();
  stats_.started_during_backward = static_cast<int>(next_launch_);
  for (auto& b : buckets_) b.pending = 0;  // parameters without a gradient this step contribute zeros
  launch_ready_buckets();
  const int n = comm_ ? comm_->size() : 1;
  stats_.bytes_sent = stats_.bytes_uncompressed = 0;
  for (auto& b : buckets_)
    stats_.bytes_uncompressed += n > 1 ? 2 * (n - 1) * b.wide.numel() * static_cast<int64_t>(b.wide.element_size()) / n : 0;
  if (codec_ && n > 1) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      Bucket& b = buckets_[i];
      auto st = comm::compressed_all_reduce(*comm_, b.wide_grads, *codec_, &feedback_, static_cast<int64_t>(i));
      stats_.bytes_sent += st.bytes_sent;
      if (b.wide.numel() > b.wide_grads.numel()) {
        // The side values (the loss) are averaged exactly, not through the codec.
        at::Tensor side = b.wide.narrow(0, b.wide_grads.numel(), b.wide.numel() - b.wide_grads.numel());
        comm_->all_reduce(side, comm::ReduceOp::Avg)->wait();
      }
      b.done = true;
      b.completed = Clock::now();
    }
  } else {
    stats_.bytes_sent = stats_.bytes_uncompressed;
  }
  for (auto& b : buckets_) {
    if (b.done) continue;
    b.work->wait();
    b.done = true;
    b.completed = Clock::now();
  }
  std::vector<std::pair<Clock::time_point, Clock::time_point>> intervals;
  for (const auto& b : buckets_) intervals.emplace_back(b.launched, b.completed);
  const auto end = Clock::now();
  stats_.comm_time_s = busy_seconds(intervals);
  stats_.exposed_comm_time_s = std::chrono::duration<double>(end - backward_done_).count();
  if (!comm_ || comm_->size() == 1) stats_.exposed_comm_time_s = 0;
  reset_pass();
}

}  // namespace crosstrain::parallel
