#include "crosstrain/scheduler/observed_executor.h"

#include <optional>

namespace crosstrain::scheduler {

void ObservedExecutor::observe(const std::vector<int64_t>& running) {
  std::map<int64_t, uint64_t> asked;
  {
    std::lock_guard<std::mutex> lock(seen_mutex_);
    for (int64_t id : running) asked[id] = changes_[id];
  }
  std::vector<std::string> lost = inner_.lost_clusters();
  std::map<int64_t, ExecStatus> answers;
  for (const auto& [id, change] : asked) answers[id] = inner_.status(id);
  std::lock_guard<std::mutex> lock(seen_mutex_);
  lost_ = std::move(lost);
  // Jobs no longer running are not asked about again: what was seen of them goes (the map stays the running set).
  for (auto it = seen_.begin(); it != seen_.end();) it = asked.count(it->first) ? std::next(it) : seen_.erase(it);
  for (auto& [id, status] : answers)
    if (changes_[id] == asked[id]) seen_[id] = std::move(status);  // else the job started or stopped meanwhile
}

ObservedExecutor::ObservedExecutor(Executor& inner) : inner_(inner), actor_([this] { act_loop(); }) {}

ObservedExecutor::~ObservedExecutor() {
  {
    std::lock_guard<std::mutex> lock(seen_mutex_);
    closing_ = true;
  }
  acted_.notify_all();
  actor_.join();
}

void ObservedExecutor::forget_locked(int64_t job_id) {
  ++changes_[job_id];
  auto it = seen_.find(job_id);
  if (it == seen_.end()) return;
  it->second.kind = ExecStatus::Unknown;
  it->second.failed_share = -1;
  it->second.detail = "not observed since it changed";
}

void ObservedExecutor::queue(Action action) {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  const int64_t id = action.kind == Action::Start || action.kind == Action::StartShare ? action.job.id : action.job_id;
  action.job_id = id;
  forget_locked(id);
  failed_starts_.erase(id);  // a new start or a stop: an earlier start's failure is moot
  ++acting_[id];
  actions_.push_back(std::move(action));
  acted_.notify_all();
}

// The actions in the order the scheduler decided them (a stop before the start that follows it).
void ObservedExecutor::act_loop() {
  std::unique_lock<std::mutex> lock(seen_mutex_);
  for (;;) {
    acted_.wait(lock, [&] { return closing_ || !actions_.empty(); });
    if (actions_.empty()) return;  // closing, and nothing left to do
    const Action a = actions_.front();
    lock.unlock();
    std::optional<ExecStatus> failed = act(a);
    lock.lock();
    actions_.pop_front();
    // A start's failure counts only while nothing newer was decided for the job (a stop, another start).
    if (failed && acting_[a.job_id] == 1) failed_starts_[a.job_id] = *failed;
    if (--acting_[a.job_id] == 0) acting_.erase(a.job_id);
    // An observation made before or while it acted is older than what it did: forgotten, and dropped if in flight.
    forget_locked(a.job_id);
    acted_.notify_all();
  }
}

// Makes the action; a start's failure is returned (stops are best effort, as they were before).
std::optional<ExecStatus> ObservedExecutor::act(const Action& a) {
  try {
    switch (a.kind) {
      case Action::Start: inner_.start(a.job, a.placement); break;
      case Action::Stop: inner_.stop(a.job_id); break;
      case Action::StopShare: inner_.stop_share(a.job_id, a.share); break;
      case Action::StartShare: inner_.start_share(a.job, a.placement, a.share); break;
    }
  } catch (const std::exception& e) {
    if (a.kind != Action::Start && a.kind != Action::StartShare) return std::nullopt;
    ExecStatus failed;
    failed.kind = ExecStatus::Failed;
    failed.start_failed = true;
    failed.failed_share = a.kind == Action::StartShare ? static_cast<int>(a.share) : -1;
    failed.detail = e.what();
    return failed;
  }
  return std::nullopt;
}

void ObservedExecutor::start(const JobRecord& job, const PlacementRecord& placement) {
  queue({Action::Start, job, placement, job.id, 0});
}

void ObservedExecutor::stop(int64_t job_id) { queue({Action::Stop, {}, {}, job_id, 0}); }

void ObservedExecutor::stop_share(int64_t job_id, size_t share) {
  queue({Action::StopShare, {}, {}, job_id, share});
}

void ObservedExecutor::start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  queue({Action::StartShare, job, placement, job.id, share});
}

bool ObservedExecutor::settle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(seen_mutex_);
  return acted_.wait_for(lock, timeout, [&] { return actions_.empty(); });
}

void ObservedExecutor::forget_lost() {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  lost_.clear();
}

ExecStatus ObservedExecutor::status(int64_t job_id) {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  const auto it = seen_.find(job_id);
  ExecStatus status;
  if (it != seen_.end()) status = it->second;  // its newest checkpoint stays known whatever happens next
  if (acting_.count(job_id)) {
    status.kind = ExecStatus::Unknown;
    status.failed_share = -1;
    status.detail = "being started or stopped";
    return status;
  }
  const auto failed = failed_starts_.find(job_id);
  if (failed != failed_starts_.end()) {
    ExecStatus once = failed->second;
    once.checkpoint_step = status.checkpoint_step;
    failed_starts_.erase(failed);
    return once;
  }
  if (it == seen_.end()) status.detail = "not observed yet";
  return status;
}

std::vector<std::string> ObservedExecutor::lost_clusters() {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  return lost_;
}

}  // namespace crosstrain::scheduler
