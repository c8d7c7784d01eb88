// The control layer: where a job runs. For a job (model shape, ranks, batch, QoS), the steps it has left and the
// registry's free capacity, choose the clusters and the ranks on each, the layout inside them and the sync mode
// across them, or refuse with a reason. Pure and fast: a few dozen planner estimates (planner/estimate.h), memoised.
//
// The rules, in order:
//  1. One cluster with enough free devices: the fastest such cluster (ties within 1%: the one left with the fewest
//     free devices, best fit). Inside it: tp x pp x dp, ZeRO and recompute, the fastest layout that fits in memory.
//  2. Else, unless the QoS forbids wide-area traffic (max_wan_gbps = 0): two clusters (every pair with room), then
//     the 3..max_clusters clusters with the most free devices; ranks fill the faster devices first, in multiples of
//     tp. Data parallelism spans the clusters; the sync mode is the faster of sync and hierarchical, unless DiLoCo
//     is at least diloco_min_speedup times faster (it converges less per step) or the synchronous modes exceed
//     the QoS's wide-area bandwidth. Wide-area use counts a ring over the clusters of the fp32 gradient, per step
//     (sync, hierarchical) or per inner_steps steps (DiLoCo).
//  3. Every candidate must meet the deadline (steps left x predicted step) and the budget (device-hours x price).
// A job that does not fit now stays queued; classify() asks the same question of an empty registry to tell a job
// that can never run (rejected) from one that must wait.
#pragma once

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "crosstrain/planner/layout.h"
#include "crosstrain/scheduler/job.h"
#include "crosstrain/scheduler/registry.h"

namespace crosstrain::scheduler {

struct PlacementOptions {
  std::vector<int> tp{1, 2, 4, 8};
  std::vector<int> pp{1, 2, 4};
  int diloco_inner_steps = 50;
  double diloco_min_speedup = 1.25;
  int max_clusters = 3;
};

// What is left of a job when it is (re)placed.
struct JobProgress {
  int64_t steps_left = 0;
  double seconds_left = std::numeric_limits<double>::infinity();  // until its deadline
  double budget_left = std::numeric_limits<double>::infinity();
};
JobProgress progress_of(const JobRecord& job, double now_s);  // from the spec's QoS and the newest checkpoint

enum class Verdict { Placed, NotNow, Never };
const char* to_string(Verdict v);

struct Decision {
  Verdict verdict = Verdict::NotNow;
  PlacementRecord placement;  // when placed
  std::string reason;         // when not
  int estimates = 0;          // planner estimates run (cache misses)
  // When placed: one line per cluster of the registry saying why it was or was not used ("east: used, 2 ranks",
  // "west: lost", "c: full", "b: slower, 0.91 s a step with it against 0.52", "d: not needed, the job fits on
  // fewer clusters").
  std::vector<std::string> clusters;
};

// Best layouts already estimated, by model, batch, clusters and ranks, sync mode: the same job shapes recur.
class LayoutCache {
 public:
  struct Entry {
    bool feasible = false;
    planner::Layout layout;
    double step_s = 0;
    int shapes = 0;  // tp x pp x dp shapes that divide the model and the batch (0: none, whatever the memory)
  };
  const Entry* find(const std::string& key) const;
  void put(const std::string& key, Entry e);
  size_t size() const { return map_.size(); }

 private:
  std::map<std::string, Entry> map_;
};

// Against the registry's free devices now: Placed or NotNow (with the reason of the nearest miss).
Decision place(const JobSpec& job, const JobProgress& progress, const Registry& registry,
               const PlacementOptions& options = {}, LayoutCache* cache = nullptr);
// place(), and when it does not place, the same against every device free: NotNow if that places, else Never.
Decision classify(const JobSpec& job, const JobProgress& progress, const Registry& registry,
                  const PlacementOptions& options = {}, LayoutCache* cache = nullptr);

}  // namespace crosstrain::scheduler
