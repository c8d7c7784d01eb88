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
  for (const ClusterShare& s : placement.shares) used_[s.cluster] += s.ranks;
  jobs_[job.id] = {placement, now_, job.step, job.spec.steps, std::max<int64_t>(1, job.spec.checkpoint_every)};
  ++starts_;
}

void SimulatedExecutor::stop(int64_t job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  for (const ClusterShare& s : it->second.placement.shares) used_[s.cluster] -= s.ranks;
  jobs_.erase(it);
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
  if (crash_.erase(job_id) && st.kind == ExecStatus::Running) {
    st.kind = ExecStatus::Failed;
    st.detail = "simulated crash of a rank";
  }
  if (st.kind != ExecStatus::Running) stop(job_id);
  return st;
}

int SimulatedExecutor::used(const std::string& cluster) const {
  auto it = used_.find(cluster);
  return it == used_.end() ? 0 : it->second;
}

}  // namespace crosstrain::scheduler
