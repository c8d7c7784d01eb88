// Layout search: every dp x tp x pp, ZeRO stage, micro-batch size and count, schedule (interleaved with 2 or 4
// chunks), sequence parallelism, recompute and, across clusters, sync mode (DiLoCo with several inner-step
// counts) for a fixed global batch; pruned by memory, ranked by predicted step time or by cost. Pure.
//
//   SearchResult r = search_layouts(model, cluster, {.global_batch = 1536});
//   r.best.front().layout;  r.candidates_per_s;
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/planner/estimate.h"

namespace crosstrain::planner {

struct SearchOptions {
  int64_t global_batch = 0;          // sequences per step (required)
  int devices = 0;                   // devices to use; 0: every device of the cluster file
  std::string rank_by = "time";      // time or cost
  int top = 5;
  std::vector<std::string> precisions{"bf16"};
  std::vector<int> micro_batches{1, 2, 4, 8};
  std::vector<int> diloco_inner_steps{10, 50, 100, 500};
  int max_tp = 0;                    // 0: the largest devices_per_host
  double tokens = 0;                 // for time-to-train and cost
  int threads = 0;                   // 0: one per core (the candidates are independent)
};

struct SearchResult {
  std::vector<Estimate> best;        // the `top` best feasible layouts, best first
  int64_t candidates = 0;            // configurations considered (every one is estimated or pruned by memory)
  int64_t pruned_by_memory = 0;
  int64_t feasible = 0;
  double seconds = 0;
  double candidates_per_s = 0;
};

// Throws UsageError for an impossible request (no global batch, more devices than the file has).
SearchResult search_layouts(const ModelShape& model, const ClusterFile& cluster, const SearchOptions& options);

// Every layout the search would consider, in its order (for tests and for measuring a search's candidates).
std::vector<Layout> enumerate_layouts(const ModelShape& model, const ClusterFile& cluster, const SearchOptions& options);

}  // namespace crosstrain::planner
