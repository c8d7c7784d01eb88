#include "crosstrain/sync/param_server.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace {
constexpr int kTagRequest = 7101, kTagData = 7102, kTagReplyHeader = 7103, kTagReplyData = 7104;
// Request: type, clock, the worker was asked to stop, unused x2. Reply: version, slowest clock, slowest worker,
// staleness, the server heard of a stop.
constexpr int64_t kHeaderWords = 5;
}  // namespace

ParameterServer::ParameterServer(comm::Communicator& group, const at::Tensor& initial, comm::Millis timeout,
                                 int64_t initial_clock)
    : rank_(group.rank()),
      size_(group.size()),
      numel_(initial.numel()),
      core_(group, timeout, "parameter server", kTagRequest, kHeaderWords, initial_clock) {
  shard_ = initial.reshape(-1).slice(0, shard_begin(rank_), shard_end(rank_)).clone();
  last_pull_version_.assign(size_, 0);
  core_.start([this](int worker, const at::Tensor& header) { serve(worker, header); });
}

int64_t ParameterServer::shard_begin(int s) const { return numel_ * s / size_; }
int64_t ParameterServer::shard_end(int s) const { return numel_ * (s + 1) / size_; }

void ParameterServer::handle(int w, int64_t clock, const at::Tensor& delta, at::Tensor& header) {
  std::lock_guard<std::mutex> lock(core_.mutex());
  const int64_t staleness = std::max<int64_t>(0, core_.clocks_locked().version - last_pull_version_[w]);
  shard_.add_(delta, 1.0 / size_);
  const comm::ParamServerCore::Clocks c = core_.record_push_locked(w, clock);
  last_pull_version_[w] = c.version;
  auto* h = header.data_ptr<int64_t>();
  h[0] = c.version;
  h[1] = c.min_clock;
  h[2] = c.slowest;
  h[3] = staleness;
  h[4] = stop_known_ ? 1 : 0;
}

void ParameterServer::serve(int w, const at::Tensor& request) {
  const int64_t type = request.data_ptr<int64_t>()[0], clock = request.data_ptr<int64_t>()[1];
  if (type != kPush) throw Error("unknown request type " + std::to_string(type));
  if (request.data_ptr<int64_t>()[2] != 0) stop_known_ = true;
  comm::Communicator& group = core_.group();
  at::Tensor delta = at::empty({shard_end(rank_) - shard_begin(rank_)}, at::kFloat);
  group.recv(delta, w, kTagData)->wait(core_.timeout());
  at::Tensor reply = at::zeros({kHeaderWords}, at::kLong);
  handle(w, clock, delta, reply);
  at::Tensor data;
  {
    std::lock_guard<std::mutex> lock(core_.mutex());
    data = shard_.clone();
  }
  auto a = group.send(reply, w, kTagReplyHeader);
  auto b = group.send(data, w, kTagReplyData);
  a->wait(core_.timeout());
  b->wait(core_.timeout());
  core_.count_bytes(data.numel() * 4 + kHeaderWords * 8);
}

ParameterServer::Reply ParameterServer::push_pull(const at::Tensor& delta, at::Tensor& params, int64_t clock) {
  core_.check_usable("push_pull");
  if (stop_asked_) stop_known_ = true;
  comm::Communicator& group = core_.group();
  at::Tensor flat_delta = delta.reshape(-1).contiguous();
  std::vector<at::Tensor> headers(size_), datas(size_), parts(size_), requests(size_);
  std::vector<comm::WorkPtr> sends, recvs;
  for (int s = 0; s < size_; ++s) {
    headers[s] = at::zeros({kHeaderWords}, at::kLong);
    parts[s] = flat_delta.slice(0, shard_begin(s), shard_end(s)).contiguous();
    if (s == rank_) continue;
    requests[s] = core_.header(kPush, clock);
    requests[s].data_ptr<int64_t>()[2] = stop_asked_ ? 1 : 0;
    sends.push_back(group.send(requests[s], s, kTagRequest));
    sends.push_back(group.send(parts[s], s, kTagData));
    datas[s] = at::empty({shard_end(s) - shard_begin(s)}, at::kFloat);
    recvs.push_back(group.recv(headers[s], s, kTagReplyHeader));
    recvs.push_back(group.recv(datas[s], s, kTagReplyData));
    core_.count_bytes(parts[s].numel() * 4 + kHeaderWords * 8);
  }
  handle(rank_, clock, parts[rank_], headers[rank_]);
  {
    std::lock_guard<std::mutex> lock(core_.mutex());
    datas[rank_] = shard_.clone();
  }
  for (auto& w : sends) w->wait(core_.timeout());
  for (auto& w : recvs) w->wait(core_.timeout());
  at::Tensor flat = params.reshape(-1);
  for (int s = 0; s < size_; ++s) flat.slice(0, shard_begin(s), shard_end(s)).copy_(datas[s]);
  Reply r;
  r.staleness = 0;
  r.min_clock = INT64_MAX;
  for (int s = 0; s < size_; ++s) {
    auto* h = headers[s].data_ptr<int64_t>();
    r.staleness = std::max(r.staleness, h[3]);
    r.stop = r.stop || h[4] != 0;
    if (h[1] < r.min_clock) {
      r.min_clock = h[1];
      r.slowest = static_cast<int>(h[2]);
    }
  }
  core_.rethrow_failure();
  return r;
}

ParameterServer::Reply ParameterServer::local_clocks() const {
  const comm::ParamServerCore::Clocks c = core_.clocks();
  Reply r;
  r.min_clock = c.min_clock;
  r.slowest = c.slowest;
  return r;
}

void ParameterServer::finish() { core_.finish(); }

}  // namespace crosstrain::train
