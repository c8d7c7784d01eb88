#include "crosstrain/scheduler/sim_executor.h"

#include <algorithm>
#include <cmath>

#include "crosstrain/core/error.h"

namespace crosstrain::scheduler {

SimulatedExecutor SimulatedExecutor::for_registry(const Registry& registry) {
  std::map<std::string, int> capacity;
  for (const ClusterInfo& c : registry.clusters()) capacity[c.name] = c.devices;
  return SimulatedExecutor(std::move(capacity));
}

void SimulatedExecutor::start(const JobRecord& job, const PlacementRecord& placement) {
  if (fail_start_.erase(job.id)) throw Error("simulated start failure of job " + std::to_string(job.id));
  if (jobs_.count(job.id)) throw Error("job " + std::to_string(job.id) + " started twice");
  if (placement.ranks() < job.spec.least_ranks() || placement.ranks() > job.spec.ranks) {
    ++partial_gangs_;
    throw Error("job " + std::to_string(job.id) + ": placement covers " + std::to_string(placement.ranks()) +
                " of its " + std::to_string(job.spec.least_ranks()) + ".." + std::to_string(job.spec.ranks) + " ranks");
  }
  for (const ClusterShare& s : placement.shares) {
    const auto cap = capacity_.find(s.cluster);
    if (lost_.count(s.cluster) || (cap != capacity_.end() && used(s.cluster) + s.ranks > cap->second)) {
      ++overcommits_;
      throw Error("job " + std::to_string(job.id) + ": cluster " + s.cluster + " is lost or full");
    }
  }
  for (const ClusterShare& s : placement.shares)
    if (!s.absent) used_[s.cluster] += s.ranks;
  jobs_[job.id] = {placement, now_, job.step, job.spec.steps, std::max<int64_t>(1, job.spec.checkpoint_every)};
  ++starts_;
}

void SimulatedExecutor::stop(int64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (const ClusterShare& s : it->second.placement.shares)
    if (!s.absent) used_[s.cluster] -= s.ranks;
  jobs_.erase(it);
}

void SimulatedExecutor::stop_share(int64_t job_id, size_t share) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || share >= it->second.placement.shares.size()) return;
  ClusterShare& s = it->second.placement.shares[share];
  if (!s.absent) used_[s.cluster] -= s.ranks;
  s.absent = true;
}

// The job's own copy of its placement says which share is absent; the scheduler's is the same.
void SimulatedExecutor::start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  auto it = jobs_.find(job.id);
  if (it == jobs_.end()) throw Error("job " + std::to_string(job.id) + " is not running: no share to start again");
  if (fail_share_start_.erase(job.id))
    throw Error("simulated failure to start share " + std::to_string(share) + " of job " + std::to_string(job.id));
  ClusterShare& s = it->second.placement.shares.at(share);
  if (s.absent) s.cluster = placement.shares.at(share).cluster;  // it may grow onto another cluster (other_home)
  const auto cap = capacity_.find(s.cluster);
  if (!s.absent || lost_.count(s.cluster) || (cap != capacity_.end() && used(s.cluster) + s.ranks > cap->second)) {
    ++overcommits_;
    throw Error("job " + std::to_string(job.id) + ": share " + std::to_string(share) + " on " + s.cluster +
                " is running already, or its cluster is lost or full");
  }
  used_[s.cluster] += s.ranks;
  s.absent = false;
  ++share_starts_;
}

ExecStatus SimulatedExecutor::status(int64_t job_id) {
  auto it = jobs_.find(job_id);
  ExecStatus st;
  if (it == jobs_.end()) return st;
  const Run& r = it->second;
  const double done = r.placement.step_s > 0 ? std::floor((now_ - r.started_s) / r.placement.step_s) : 0;
  st.step = std::min<int64_t>(r.steps, r.first_step + static_cast<int64_t>(done));
  st.checkpoint_step = st.step == r.steps ? r.steps : st.step / r.checkpoint_every * r.checkpoint_every;
  st.kind = st.step >= r.steps ? ExecStatus::Done : ExecStatus::Running;
  auto crash = crash_.find(job_id);
  if (crash != crash_.end() && st.kind == ExecStatus::Running) {
    st.kind = ExecStatus::Failed;
    st.failed_share = crash->second;
    st.detail = "simulated crash of a rank" +
                (crash->second >= 0 ? " of share " + std::to_string(crash->second) : std::string());
  }
  if (crash != crash_.end()) crash_.erase(crash);
  // A failed share alone leaves the job to the scheduler (it may go on without it, share 0 too where a standby
  // takes its store over); a failure of no known share fails the gang.
  if (st.kind == ExecStatus::Done || (st.kind == ExecStatus::Failed && (!share_changes_ || st.failed_share < 0)))
    stop(job_id);
  return st;
}

int SimulatedExecutor::used(const std::string& cluster) const {
  auto it = used_.find(cluster);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace crosstrain::scheduler
