#include "crosstrain/comm/param_server_core.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "crosstrain/core/error.h"

namespace crosstrain::comm {
namespace {
constexpr const char* kWaitingForRequest = "waiting for its next request (a live worker sends one every sync period): ";
}  // namespace

ParamServerCore::ParamServerCore(Communicator& group, Millis timeout, std::string name, int request_tag,
                                 int64_t header_words, int64_t initial_clock)
    : group_(group),
      timeout_(timeout),
      name_(std::move(name)),
      request_tag_(request_tag),
      header_words_(header_words),
      rank_(group.rank()),
      size_(group.size()),
      clocks_(static_cast<size_t>(size_), initial_clock) {
  if (header_words < 2) throw Error(name_ + ": a request header needs at least its type and clock");
}

ParamServerCore::~ParamServerCore() {
  stop_ = true;
  for (auto& t : threads_)
    if (t.joinable()) t.join();
}

void ParamServerCore::start(Serve serve) {
  if (!threads_.empty()) throw Error(name_ + ": started twice");
  for (int w = 0; w < size_; ++w)
    if (w != rank_) threads_.emplace_back([this, w, serve] { serve_worker(w, serve); });
}

at::Tensor ParamServerCore::header(int64_t type, int64_t clock) const {
  at::Tensor h = at::zeros({header_words_}, at::kLong);
  h.data_ptr<int64_t>()[0] = type;
  h.data_ptr<int64_t>()[1] = clock;
  return h;
}

void ParamServerCore::serve_worker(int worker, const Serve& serve) {
  try {
    for (;;) {
      at::Tensor request = at::empty({header_words_}, at::kLong);
      try {
        group_.recv(request, worker, request_tag_)->wait(2 * timeout_);
      } catch (const CommError& e) {
        throw CommError(e.context(), std::string(kWaitingForRequest) + e.cause(), e.timed_out());
      } catch (const std::exception& e) {
        throw Error(std::string(kWaitingForRequest) + e.what());
      }
      if (request.data_ptr<int64_t>()[0] == kBye || stop_) return;
      serve(worker, request);
    }
  } catch (const std::exception& e) {
    record_failure(worker, e);
  }
}

void ParamServerCore::record_failure(int worker, const std::exception& e) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) return;
  // A communication failure keeps its type: elastic training recovers from one (a failure generation ends every
  // server thread's wait with one).
  const std::string who = name_ + " of rank " + std::to_string(rank_) + ", serving worker " + std::to_string(worker) + ": ";
  if (const auto* comm = dynamic_cast<const CommError*>(&e)) {
    failure_ = std::make_exception_ptr(CommError(comm->context(), who + comm->cause(), comm->timed_out()));
    return;
  }
  failure_ = std::make_exception_ptr(Error(who + e.what()));
}

ParamServerCore::Clocks ParamServerCore::record_push_locked(int worker, int64_t clock) {
  clocks_[worker] = std::max(clocks_[worker], clock);
  ++version_;
  return clocks_locked();
}

ParamServerCore::Clocks ParamServerCore::clocks_locked() const {
  const auto slowest = std::min_element(clocks_.begin(), clocks_.end());
  return Clocks{version_, *slowest, static_cast<int>(slowest - clocks_.begin())};
}

ParamServerCore::Clocks ParamServerCore::clocks() const {
  rethrow_failure();
  std::lock_guard<std::mutex> lock(mutex_);
  return clocks_locked();
}

void ParamServerCore::rethrow_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
}

void ParamServerCore::check_usable(const char* op) const {
  rethrow_failure();
  if (finished_) throw Error(name_ + ": " + op + " after finish()");
}

void ParamServerCore::finish() {
  if (finished_) return;
  finished_ = true;
  std::vector<at::Tensor> byes;
  std::vector<std::pair<int, WorkPtr>> sends;
  for (int s = 0; s < size_; ++s) {
    if (s == rank_) continue;
    byes.push_back(header(kBye, 0));
    sends.emplace_back(s, group_.send(byes.back(), s, request_tag_));
  }
  for (auto& [server, work] : sends) {
    try {
      work->wait(timeout_);
    } catch (const CommError& e) {
      throw CommError(e.context(), name_ + ": goodbye to server " + std::to_string(server) + ": " + e.cause(), e.timed_out());
    } catch (const std::exception& e) {
      throw Error("[rank " + std::to_string(rank_) + "] " + name_ + ": goodbye to server " + std::to_string(server) +
                  ": " + e.what());
    }
  }
  for (auto& t : threads_)
    if (t.joinable()) t.join();
  rethrow_failure();
}

}  // namespace crosstrain::comm
