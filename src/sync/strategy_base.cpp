// What the sync modes share (strategy_base.h): flat views of a list of tensors, the cross-cluster average of a
// flat buffer that hierarchical sync and DiLoCo run, and the parts of StrategyBase that every mode inherits
// (attaching the tensors, the experiment's slowdown, writing new values back). Kept apart from the modes so that
// each mode's file holds only what that mode does.
#include "strategy_base.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace crosstrain::train::sync_detail {

// ---- flat views of a list of parameters -------------------------------------------------------------------

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

// ---- CrossClusterAverage --------------------------------------------------------------------------------------

CrossClusterAverage::CrossClusterAverage(comm::Communicator* local, comm::Communicator* cross,
                                         const std::string& codec, comm::Millis timeout, bool whole)
    : local_(local), cross_(cross), timeout_(timeout), whole_(whole) {
  if (codec != "none") codec_ = comm::make_codec(codec);
}

at::Tensor CrossClusterAverage::piece_of(const at::Tensor& flat) const {
  const int64_t chunk = (flat.numel() + local_size() - 1) / local_size();
  at::Tensor piece = at::zeros({chunk}, at::kFloat);
  const int64_t begin = std::min<int64_t>(flat.numel(), chunk * local_rank());
  const int64_t end = std::min<int64_t>(flat.numel(), begin + chunk);
  piece.slice(0, 0, end - begin).copy_(flat.slice(0, begin, end));
  return piece;
}

void CrossClusterAverage::exchange(at::Tensor& piece, int64_t buffer_id) {
  if (!cross_) return;
  if (codec_) {
    auto st = comm::compressed_all_reduce(*cross_, piece, *codec_, &feedback_, buffer_id);
    bytes_ += st.bytes_sent;
  } else {
    cross_->all_reduce(piece, comm::ReduceOp::Avg)->wait(timeout_);
    bytes_ += 2 * (cross_->size() - 1) * 4 * piece.numel() / cross_->size();
  }
}

void CrossClusterAverage::gather(at::Tensor& flat, const at::Tensor& piece) {
  if (local_ && whole_) {  // the leader (local rank 0) holds the average
    at::Tensor all = piece.contiguous();
    local_->broadcast(all, 0)->wait(timeout_);
    flat.copy_(all.slice(0, 0, flat.numel()));
    return;
  }
  if (!local_) {
    flat.copy_(piece.slice(0, 0, flat.numel()));
    return;
  }
  at::Tensor all = at::empty({piece.numel() * local_->size()}, at::kFloat);
  local_->all_gather(piece, all)->wait(timeout_);
  flat.copy_(all.slice(0, 0, flat.numel()));
}

void CrossClusterAverage::average(at::Tensor& flat, int64_t buffer_id) {
  at::Tensor piece = piece_of(flat);
  exchange(piece, buffer_id);
  gather(flat, piece);
}

// ---- StrategyBase ---------------------------------------------------------------------------------------------

void StrategyBase::attach(std::vector<at::Tensor> tensors, bool sharded, std::function<void()> changed) {
  s_.parameters = std::move(tensors);
  sharded_ = sharded;
  changed_ = std::move(changed);
  attached();
}

void StrategyBase::before_step(int64_t step) {
  if (s_.config.slow_ms > 0 && s_.world_rank == s_.config.slow_rank)
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(1000 * s_.config.slow_ms)));
}

void StrategyBase::set_tensors(const at::Tensor& flat) {
  unflatten(flat, s_.parameters);
  if (changed_) changed_();
}

}  // namespace crosstrain::train::sync_detail
