// Notices about a config that is valid but probably not what its author meant. They are printed once, by the
// process the user started (`crosstrain train`) and by `crosstrain config`.
#include <algorithm>
#include <string>
#include <vector>

#include "crosstrain/train/config.h"
#include "crosstrain/train/sync_mode.h"

namespace crosstrain::train {

std::vector<std::string> config_notices(const Config& c) {
  std::vector<std::string> out;
  const std::string steps = std::to_string(c.train.steps);
  if (c.train.warmup_steps > c.train.steps)
    out.push_back("train.steps = " + steps + " ends inside the " + std::to_string(c.train.warmup_steps) +
                  "-step warm-up (train.warmup_steps): the learning rate never reaches train.lr; lower "
                  "train.warmup_steps for a short run");
  if (c.sync.mode == SyncMode::DiLoCo && c.sync.inner_steps > 0) {
    const int64_t outer = c.train.steps / c.sync.inner_steps;
    const std::string h = std::to_string(c.sync.inner_steps);
    if (outer == 0)
      out.push_back("train.steps = " + steps + " ends before DiLoCo's first outer step (sync.inner_steps = " + h +
                    "): the clusters never average; lower sync.inner_steps");
    else if (outer == 1)
      out.push_back("train.steps = " + steps + " makes a single DiLoCo outer step (sync.inner_steps = " + h +
                    "); lower sync.inner_steps for more");
  }
  if (c.parallel.pp > 1 && c.train.micro_batches < c.parallel.pp)
    out.push_back("train.micro_batches = " + std::to_string(c.train.micro_batches) + " is raised to " +
                  std::to_string(c.parallel.pp) + " for a " + std::to_string(c.parallel.pp) +
                  "-stage pipeline (parallel.pp): one micro-batch per stage at the least; more shrink the bubble");
  return out;
}

std::vector<std::string> host_notices(const Config& c, int ranks, int cores) {
  const int64_t threads = ranks * c.train.threads_per_rank;
  if (threads <= cores) return {};
  return {std::to_string(ranks) + " ranks x " + std::to_string(c.train.threads_per_rank) + " compute thread" +
          (c.train.threads_per_rank == 1 ? "" : "s") + " on " + std::to_string(cores) + " core" +
          (cores == 1 ? "" : "s") + ": the ranks take turns on the cores, so steps take longer than on a machine "
          "that fits them, and the MFU reads low (its peak is timed by each rank with the cores to itself); use "
          "--nproc " + std::to_string(std::max<int64_t>(1, cores / c.train.threads_per_rank)) + " or fewer for "
          "figures you can compare"};
}

}  // namespace crosstrain::train
