#include "bench_cost_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <tuple>

#include "crosstrain/comm/algorithms/collectives.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"
#include "launcher.h"

namespace crosstrain::apps {
namespace {

using comm::Communicator;
using comm::max_over_ranks;
using comm::median;
using comm::ReduceOp;
using comm::algo::Algorithm;
using Clock = std::chrono::steady_clock;

// Median seconds of `op` with `a` on a buffer of `bytes` (the all-reduce and broadcast buffer, the reduce-scatter
// input, the all-gather output: as comm::predict counts them), the slowest rank's median. Iterations rotate
// through 8 MiB of buffers, as the calibration does: gradients arrive cold, not in cache from the last iteration.
double measure(Communicator& c, Algorithm a, comm::Collective op, int64_t bytes) {
  const int n = c.size();
  const int64_t per = std::max<int64_t>(1, bytes / 4 / n), whole = per * n;
  const int pool = static_cast<int>(std::clamp<int64_t>((8 << 20) / (whole * 4), 1, 64));
  std::vector<at::Tensor> big, small;
  for (int i = 0; i < pool; ++i) big.push_back(at::zeros({whole})), small.push_back(at::zeros({per}));
  auto algorithm = comm::algo::make_algorithm(a, c);
  algorithm->reserve(whole, at::kFloat);
  auto run = [&](int i) {
    at::Tensor &b = big[i % pool], &s = small[i % pool];
    switch (op) {
      case comm::Collective::AllReduce: algorithm->all_reduce(b, ReduceOp::Sum); break;
      case comm::Collective::ReduceScatter: algorithm->reduce_scatter(b, s, ReduceOp::Sum); break;
      case comm::Collective::AllGather: algorithm->all_gather(s, b); break;
      case comm::Collective::Broadcast: algorithm->broadcast(b, 0); break;
    }
  };
  run(0);
  c.barrier()->wait();
  const int iters = bytes >= (4 << 20) ? 9 : 25;
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    run(i);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return max_over_ranks(c, median(times));
}

comm::Collective parse_collective(const std::string& name) {
  for (auto op : {comm::Collective::AllReduce, comm::Collective::ReduceScatter, comm::Collective::AllGather,
                  comm::Collective::Broadcast})
    if (name == comm::to_string(op)) return op;
  throw UsageError("--op '" + name + "': use allreduce, reducescatter, allgather, broadcast or all");
}

struct Row {
  std::vector<double> predicted, measured, ratio;
};

}  // namespace

int bench_cost_model(const BenchCostModelOptions& o, const std::vector<std::string>& relaunch_args) {
  if (o.repeat < 1) throw UsageError("--repeat must be at least 1");
  std::vector<comm::Collective> ops;
  if (o.op == "all") {
    ops = {comm::Collective::AllReduce, comm::Collective::ReduceScatter, comm::Collective::AllGather,
           comm::Collective::Broadcast};
  } else {
    ops = {parse_collective(o.op)};
  }
  comm::Topology file;
  if (!o.topology.empty()) file = comm::load_topology(o.topology);  // bad files fail before any rank starts
  LaunchEnv env = detect_launch_env(current_environment());
  if (o.backend == "mpi" && env.source != LaunchSource::Mpi)
    throw UsageError("--backend mpi needs a job started by mpirun: mpirun -np 2 crosstrain bench cost-model --backend mpi");
  if (env.source == LaunchSource::Single && o.nproc > 1)
    return launch_self(o.nproc, relaunch_args, std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  limit_compute_threads(1);
  comm::CommConfig config;
  config.backend = o.backend;
  config.shared_memory = false;  // the model describes the point-to-point link our algorithms use
  config.timeout_s = o.timeout_s;
  auto world = comm::init_world(env, config);
  Communicator& c = *world;
  const int n = c.size(), r = c.rank();
  if (n < 2) throw UsageError("bench cost-model needs at least 2 ranks (--nproc 2 or more)");
  const std::vector<Algorithm> algorithms{Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling};
  std::map<std::tuple<comm::Collective, int64_t, Algorithm>, Row> rows;
  for (int rep = 0; rep < o.repeat; ++rep) {
    // The links: from the file, or this host's link calibrated anew (one-way and ring-style exchanges at several
    // sizes, and the local reduction rate), so each repetition predicts from what the machine does right now.
    const comm::Topology topo = o.topology.empty() ? comm::detect_local_topology(c, /*calibrate=*/true) : file;
    const comm::Link& link = topo.bottleneck();
    if (r == 0 && rep == 0) {
      if (!o.topology.empty()) {
        std::printf("# links from %s (%d ranks described, %d running)\n", o.topology.c_str(), topo.world_size(), n);
      } else {
        for (const auto& h : topo.hosts) std::printf("# host %s: %d ranks, %d cores\n", h.name.c_str(), h.ranks, h.cores);
      }
      std::printf("# link: alpha = %.1f us, bandwidth = %.2f GB/s; exchange alpha = %.1f us, %.2f GB/s; reduce %.2f GB/s\n",
                  link.latency_s * 1e6, link.bandwidth_Bps / 1e9, link.exchange_latency_s * 1e6,
                  link.exchange_bandwidth_Bps / 1e9, link.reduce_Bps / 1e9);
      if (o.topology.empty())
        std::printf("# (straight-line fits of repetition 1; predictions read the measured curves of %zu sizes)\n",
                    link.exchange_curve.size());
    }
    for (comm::Collective op : ops) {
      for (int64_t bytes : o.sizes) {
        for (Algorithm a : algorithms) {
          const double measured = measure(c, a, op, bytes);
          const double moved = static_cast<double>(std::max<int64_t>(1, bytes / 4 / n) * n * 4);  // as measured
          const double predicted = comm::predict(op, a, moved, n, link);
          Row& row = rows[{op, bytes, a}];
          row.predicted.push_back(predicted);
          row.measured.push_back(measured);
          row.ratio.push_back(predicted / measured);
        }
      }
    }
    if (r == 0) std::fprintf(stderr, "# repetition %d/%d done\n", rep + 1, o.repeat);
  }
  if (r != 0) return 0;
  std::printf("# %d ranks over %s, medians over %d repetitions; ratio = predicted / measured\n", n,
              c.backend().c_str(), o.repeat);
  std::printf("#%13s %13s %6s %14s %14s %8s %10s %10s\n", "size(B)", "op", "algo", "predicted(us)", "measured(us)",
              "ratio", "min_ratio", "max_ratio");
  std::map<std::pair<comm::Collective, Algorithm>, int> within, total;
  for (comm::Collective op : ops) {
    for (int64_t bytes : o.sizes) {
      for (Algorithm a : algorithms) {
        const Row& row = rows[{op, bytes, a}];
        const double ratio = median(row.ratio);
        std::printf("%14lld %13s %6s %14.1f %14.1f %8.2f %10.2f %10.2f\n", static_cast<long long>(bytes),
                    comm::to_string(op), comm::algo::to_string(a), median(row.predicted) * 1e6,
                    median(row.measured) * 1e6, ratio, *std::min_element(row.ratio.begin(), row.ratio.end()),
                    *std::max_element(row.ratio.begin(), row.ratio.end()));
        ++total[{op, a}];
        if (ratio >= 0.75 && ratio <= 1.25) ++within[{op, a}];
      }
    }
  }
  for (comm::Collective op : ops)
    for (Algorithm a : algorithms)
      std::printf("cost_model_within_25pct_%s_%s=%d/%d\n", comm::to_string(op), comm::algo::to_string(a),
                  within[{op, a}], total[{op, a}]);
  return 0;
}

}  // namespace crosstrain::apps
