// `crosstrain bench cost-model`: the cost model's predicted time next to the measured one, for our ring, tree and
// halving-doubling all-reduce (or reduce-scatter, all-gather, broadcast) at several sizes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::apps {

struct BenchCostModelOptions {
  int nproc = 2;
  std::string backend = "gloo";   // whose point-to-point messages our algorithms use: gloo, or mpi under mpirun
  std::string op = "allreduce";   // allreduce, reducescatter, allgather, broadcast, or all
  // Links from this topology file (comm/cost_model.h) instead of calibrating this host's link.
  std::string topology;
  // Each repetition calibrates again (unless a file gives the links) and measures again; the table shows medians
  // over repetitions, so one noisy moment on a shared machine moves neither side alone.
  int repeat = 5;
  std::vector<int64_t> sizes{64 << 10, 1 << 20, 4 << 20, 16 << 20};
  double timeout_s = 60;
};

// Runs in every rank (launches the ranks itself when started alone). Returns the exit code.
int bench_cost_model(const BenchCostModelOptions& options, const std::vector<std::string>& relaunch_args);

}  // namespace crosstrain::apps
