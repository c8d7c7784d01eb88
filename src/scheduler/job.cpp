#include "crosstrain/scheduler/job.h"

#include "crosstrain/core/error.h"

namespace crosstrain::scheduler {

const char* to_string(JobState state) {
  switch (state) {
    case JobState::Queued: return "queued";
    case JobState::Placed: return "placed";
    case JobState::Running: return "running";
    case JobState::Failed: return "failed";
    case JobState::Done: return "done";
    case JobState::Cancelled: return "cancelled";
  }
  return "?";
}

JobState parse_job_state(const std::string& text) {
  for (JobState s : {JobState::Queued, JobState::Placed, JobState::Running, JobState::Failed, JobState::Done,
                     JobState::Cancelled})
    if (text == to_string(s)) return s;
  throw UsageError("unknown job state '" + text + "' (queued, placed, running, failed, done, cancelled)");
}

int PlacementRecord::ranks() const {
  int n = 0;
  for (const auto& s : shares) n += s.ranks;
  return n;
}

int PlacementRecord::present_ranks() const {
  int n = 0;
  for (const auto& s : shares) n += s.absent ? 0 : s.ranks;
  return n;
}

bool PlacementRecord::on(const std::string& cluster) const {
  for (const auto& s : shares)
    if (s.cluster == cluster && !s.absent) return true;
  return false;
}

bool PlacementRecord::live_elastic() const { return shares.size() >= 2 && sync == planner::LayoutSync::DiLoCo; }

bool PlacementRecord::standby_possible(int share0_nodes) const {
  return live_elastic() && shares.size() >= 3 && share0_nodes == 1;
}

}  // namespace crosstrain::scheduler
