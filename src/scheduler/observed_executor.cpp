#include "crosstrain/scheduler/observed_executor.h"

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

void ObservedExecutor::forget(int64_t job_id) {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  ++changes_[job_id];
  auto it = seen_.find(job_id);
  if (it == seen_.end()) return;
  it->second.kind = ExecStatus::Unknown;
  it->second.failed_share = -1;
  it->second.detail = "not observed since it changed";
}

void ObservedExecutor::start(const JobRecord& job, const PlacementRecord& placement) {
  forget(job.id);
  inner_.start(job, placement);
}

void ObservedExecutor::stop(int64_t job_id) {
  forget(job_id);
  inner_.stop(job_id);
}

void ObservedExecutor::stop_share(int64_t job_id, size_t share) {
  forget(job_id);
  inner_.stop_share(job_id, share);
}

void ObservedExecutor::start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  forget(job.id);
  inner_.start_share(job, placement, share);
}

void ObservedExecutor::forget_lost() {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  lost_.clear();
}

ExecStatus ObservedExecutor::status(int64_t job_id) {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  const auto it = seen_.find(job_id);
  if (it != seen_.end()) return it->second;
  ExecStatus unknown;
  unknown.kind = ExecStatus::Unknown;
  unknown.detail = "not observed yet";
  return unknown;
}

std::vector<std::string> ObservedExecutor::lost_clusters() {
  std::lock_guard<std::mutex> lock(seen_mutex_);
  return lost_;
}

}  // namespace crosstrain::scheduler
