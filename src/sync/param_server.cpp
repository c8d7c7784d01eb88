#include "crosstrain/sync/param_server.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>

#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace {
constexpr int kTagRequest = 7101, kTagData = 7102, kTagReplyHeader = 7103, kTagReplyData = 7104;
using Clock = std::chrono::steady_clock;
}  // namespace

ParameterServer::ParameterServer(comm::Communicator& group, const at::Tensor& initial, comm::Millis timeout,
                                 int64_t initial_clock)
    : group_(group), timeout_(timeout), rank_(group.rank()), size_(group.size()), numel_(initial.numel()) {
  shard_ = initial.reshape(-1).slice(0, shard_begin(rank_), shard_end(rank_)).clone();
  clocks_.assign(size_, initial_clock);
  last_pull_version_.assign(size_, 0);
  for (int w = 0; w < size_; ++w)
    if (w != rank_) threads_.emplace_back([this, w] { serve(w); });
}

ParameterServer::~ParameterServer() {
  stop_ = true;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

int64_t ParameterServer::shard_begin(int s) const { return numel_ * s / size_; }
int64_t ParameterServer::shard_end(int s) const { return numel_ * (s + 1) / size_; }

void ParameterServer::handle(int w, int64_t type, int64_t clock, const at::Tensor* delta, at::Tensor& header) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t staleness = 0;
  if (type == kPush) {
    staleness = std::max<int64_t>(0, version_ - last_pull_version_[w]);
    if (delta) shard_.add_(*delta, 1.0 / size_);
    ++version_;
    clocks_[w] = std::max(clocks_[w], clock);
    last_pull_version_[w] = version_;
  }
  auto slowest = std::min_element(clocks_.begin(), clocks_.end());
  auto* h = header.data_ptr<int64_t>();
  h[0] = version_;
  h[1] = *slowest;
  h[2] = slowest - clocks_.begin();
  h[3] = staleness;
}

void ParameterServer::serve(int w) {
  // One thread per remote worker, blocked on that worker's next request (Gloo's receives cannot be polled).
  // A worker sends a request every sync.period steps; twice the timeout covers an ssp wait that ends in its own
  // error first.
  try {
    for (;;) {
      at::Tensor header = at::zeros({4}, at::kLong);
      group_.recv(header, w, kTagRequest)->wait(2 * timeout_);
      const int64_t type = header[0].item<int64_t>(), clock = header[1].item<int64_t>();
      if (type == kBye || stop_) break;
      at::Tensor delta = at::empty({shard_end(rank_) - shard_begin(rank_)}, at::kFloat);
      group_.recv(delta, w, kTagData)->wait(timeout_);
      at::Tensor reply = at::zeros({4}, at::kLong);
      handle(w, type, clock, &delta, reply);
      at::Tensor data;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        data = shard_.clone();
      }
      auto a = group_.send(reply, w, kTagReplyHeader);
      auto b = group_.send(data, w, kTagReplyData);
      a->wait(timeout_);
      b->wait(timeout_);
      std::lock_guard<std::mutex> lock(mutex_);
      bytes_sent_ += data.numel() * 4 + 32;
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!server_failure_) server_failure_ = std::current_exception();
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++servers_done_;
}

void ParameterServer::rethrow_server_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!server_failure_) return;
  try {
    std::rethrow_exception(server_failure_);
  } catch (const std::exception& e) {
    throw Error("parameter server of rank " + std::to_string(rank_) + " failed: " + e.what());
  }
}

ParameterServer::Reply ParameterServer::push_pull(const at::Tensor& delta, at::Tensor& params, int64_t clock) {
  rethrow_server_failure();
  at::Tensor flat_delta = delta.reshape(-1).contiguous();
  std::vector<at::Tensor> headers(size_), datas(size_), parts(size_), requests(size_);
  std::vector<comm::WorkPtr> sends, recvs;
  for (int s = 0; s < size_; ++s) {
    headers[s] = at::zeros({4}, at::kLong);
    parts[s] = flat_delta.slice(0, shard_begin(s), shard_end(s)).contiguous();
    if (s == rank_) continue;
    requests[s] = at::zeros({4}, at::kLong);
    requests[s][0] = static_cast<int64_t>(kPush);
    requests[s][1] = clock;
    sends.push_back(group_.send(requests[s], s, kTagRequest));
    sends.push_back(group_.send(parts[s], s, kTagData));
    datas[s] = at::empty({shard_end(s) - shard_begin(s)}, at::kFloat);
    recvs.push_back(group_.recv(headers[s], s, kTagReplyHeader));
    recvs.push_back(group_.recv(datas[s], s, kTagReplyData));
    bytes_sent_ += parts[s].numel() * 4 + 32;
  }
  handle(rank_, kPush, clock, &parts[rank_], headers[rank_]);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    datas[rank_] = shard_.clone();
  }
  for (auto& w : sends) w->wait(timeout_);
  for (auto& w : recvs) w->wait(timeout_);
  at::Tensor flat = params.reshape(-1);
  for (int s = 0; s < size_; ++s) flat.slice(0, shard_begin(s), shard_end(s)).copy_(datas[s]);
  Reply r;
  r.staleness = 0;
  r.min_clock = INT64_MAX;
  for (int s = 0; s < size_; ++s) {
    auto* h = headers[s].data_ptr<int64_t>();
    r.staleness = std::max(r.staleness, h[3]);
    if (h[1] < r.min_clock) {
      r.min_clock = h[1];
      r.slowest = static_cast<int>(h[2]);
    }
  }
  rethrow_server_failure();
  return r;
}

ParameterServer::Reply ParameterServer::local_clocks() const {
  rethrow_server_failure();
  std::lock_guard<std::mutex> lock(mutex_);
  Reply r;
  auto slowest = std::min_element(clocks_.begin(), clocks_.end());
  r.min_clock = *slowest;
  r.slowest = static_cast<int>(slowest - clocks_.begin());
  return r;
}

void ParameterServer::finish() {
  if (finished_) return;
  finished_ = true;
  std::vector<at::Tensor> requests;
  std::vector<comm::WorkPtr> sends;
  for (int s = 0; s < size_; ++s) {
    if (s == rank_) continue;
    requests.push_back(at::zeros({4}, at::kLong));
    requests.back()[0] = static_cast<int64_t>(kBye);
    sends.push_back(group_.send(requests.back(), s, kTagRequest));
  }
  for (auto& w : sends) w->wait(timeout_);
  // The server threads end once every other worker said goodbye (each waits at most 2 x timeout).
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  rethrow_server_failure();
}

}  // namespace crosstrain::train
