#include "bench_cost_model.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "crosstrain/comm/algorithms.h"
#include "crosstrain/comm/cost_model.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"
#include "launcher.h"

namespace crosstrain::apps {
namespace {

using comm::Communicator;
using comm::ReduceOp;
using comm::algo::Algorithm;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

double max_over_ranks(Communicator& c, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  c.all_reduce(t, ReduceOp::Max)->wait();
  return t.item<double>();
}

// Median seconds of one all-reduce of `bytes` with `a` (the slowest rank's median). Iterations rotate through
// 8 MiB of buffers, as the calibration does: gradients arrive cold, not in cache from the previous iteration.
double measure(Communicator& c, Algorithm a, int64_t bytes) {
  const int64_t numel = std::max<int64_t>(1, bytes / 4);
  const int pool = static_cast<int>(std::clamp<int64_t>((8 << 20) / (numel * 4), 1, 64));
  std::vector<at::Tensor> buffers;
  for (int i = 0; i < pool; ++i) buffers.push_back(at::zeros({numel}));
  auto algorithm = comm::algo::make_algorithm(a, c);
  algorithm->reserve(numel, at::kFloat);
  algorithm->all_reduce(buffers[0], ReduceOp::Sum);
  c.barrier()->wait();
  const int iters = bytes >= (4 << 20) ? 9 : 25;
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    const auto t0 = Clock::now();
    algorithm->all_reduce(buffers[i % pool], ReduceOp::Sum);
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return max_over_ranks(c, median(times));
}

struct Row {
  std::vector<double> predicted, measured, ratio;
};

}  // namespace

int bench_cost_model(const BenchCostModelOptions& o, const std::vector<std::string>& relaunch_args) {
  if (o.repeat < 1) throw UsageError("--repeat must be at least 1");
  comm::Topology file;
  if (!o.topology.empty()) file = comm::load_topology(o.topology);  // bad files fail before any rank starts
  LaunchEnv env = detect_launch_env(current_environment());
  if (env.source == LaunchSource::Single && o.nproc > 1)
    return launch_self(o.nproc, relaunch_args, std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000)));
  limit_compute_threads(1);
  comm::CommConfig config;
  config.shared_memory = false;  // the model describes the point-to-point link our algorithms use
  config.timeout = comm::Millis(static_cast<int64_t>(o.timeout_s * 1000));
  auto world = comm::init_world(env, config);
  Communicator& c = *world;
  const int n = c.size(), r = c.rank();
  if (n < 2) throw UsageError("bench cost-model needs at least 2 ranks (--nproc 2 or more)");
  const std::vector<Algorithm> algorithms{Algorithm::Ring, Algorithm::Tree, Algorithm::HalvingDoubling};
  std::map<std::pair<int64_t, Algorithm>, Row> rows;
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
    for (int64_t bytes : o.sizes) {
      for (Algorithm a : algorithms) {
        const double measured = measure(c, a, bytes);
        const double predicted = comm::predict_all_reduce(a, static_cast<double>(bytes), n, link);
        Row& row = rows[{bytes, a}];
        row.predicted.push_back(predicted);
        row.measured.push_back(measured);
        row.ratio.push_back(predicted / measured);
      }
    }
    if (r == 0) std::fprintf(stderr, "# repetition %d/%d done\n", rep + 1, o.repeat);
  }
  if (r != 0) return 0;
  std::printf("# all-reduce on %d ranks, medians over %d repetitions; ratio = predicted / measured\n", n, o.repeat);
  std::printf("#%13s %6s %14s %14s %8s %10s %10s\n", "size(B)", "algo", "predicted(us)", "measured(us)", "ratio",
              "min_ratio", "max_ratio");
  std::map<Algorithm, int> within, total;
  for (int64_t bytes : o.sizes) {
    for (Algorithm a : algorithms) {
      const Row& row = rows[{bytes, a}];
      const double ratio = median(row.ratio);
      std::printf("%14lld %6s %14.1f %14.1f %8.2f %10.2f %10.2f\n", static_cast<long long>(bytes),
                  comm::algo::to_string(a), median(row.predicted) * 1e6, median(row.measured) * 1e6, ratio,
                  *std::min_element(row.ratio.begin(), row.ratio.end()),
                  *std::max_element(row.ratio.begin(), row.ratio.end()));
      ++total[a];
      if (ratio >= 0.75 && ratio <= 1.25) ++within[a];
    }
  }
  for (Algorithm a : algorithms)
    std::printf("cost_model_within_25pct_%s=%d/%d\n", comm::algo::to_string(a), within[a], total[a]);
  return 0;
}

}  // namespace crosstrain::apps
