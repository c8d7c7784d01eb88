#include "plan_calibrate.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <future>
#include <sstream>

#include "crosstrain/comm/init.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/comm/backends/shm.h"
#include "crosstrain/planner/estimate.h"
#include "plan_reference.h"
#include "crosstrain/core/error.h"
#include "crosstrain/obs/gemm_timer.h"
#include "crosstrain/core/threads.h"

namespace crosstrain::apps {
namespace {

using Clock = std::chrono::steady_clock;
using planner::GemmPoint;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median_of(std::vector<double> v) { return comm::median(std::move(v)); }

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "fp32") return at::kFloat;
  if (dtype == "bf16") return at::kBFloat16;
  throw UsageError("calibrate: dtype '" + dtype + "': use fp32 or bf16");
}

// FLOP/s of one shape of the grid, timed by the one GEMM timer (obs/gemm_timer.h) that also gives the MFU
// denominator (jobs/gpt/peak_flops.h).
double gemm_rate(const GemmGridShape& s, at::ScalarType dtype, double seconds) {
  return obs::time_gemm({"", s.m, s.k, s.n, false}, dtype, seconds);
}

double measure_memory_bandwidth(int64_t bytes, double seconds) {
  const int64_t numel = std::max<int64_t>(1, bytes / 4);
  at::Tensor a = at::empty({numel}), b = at::rand({numel}), c = at::rand({numel});
  at::add_out(a, b, c);  // page faults of `a` out of the timing
  std::vector<double> times;
  const auto start = Clock::now();
  while (times.size() < 5 || seconds_since(start) < seconds) {
    const auto t0 = Clock::now();
    at::add_out(a, b, c);
    times.push_back(seconds_since(t0));
  }
  return 3.0 * static_cast<double>(numel * 4) / median_of(times);
}

// Seconds per operator (forward or backward) of a chain of `ops` alternating x * s and tanh(x) on a tiny tensor
// that requires grad: forward and backward timed together, divided by 2 x ops; the median of rounds.
double measure_kernel_overhead(int ops, double seconds) {
  const at::Tensor leaf = at::randn({16}).set_requires_grad(true);
  auto round = [&] {
    at::Tensor y = leaf;
    for (int i = 0; i < ops; ++i) y = i % 2 == 0 ? y * 1.0001 : at::tanh(y);
    y.sum().backward();
  };
  round();
  std::vector<double> per_op;
  const auto start = Clock::now();
  while (per_op.size() < 5 || seconds_since(start) < seconds) {
    const auto t0 = Clock::now();
    round();
    per_op.push_back(seconds_since(t0) / (2.0 * ops));
  }
  return median_of(per_op);
}

// The per-size minimum of curve `which` over `runs`, then made non-decreasing from the largest size down.
std::vector<comm::Sample> merged_curve(const std::vector<comm::Link>& runs,
                                       std::vector<comm::Sample> comm::Link::*which) {
  std::vector<comm::Sample> curve = runs[0].*which;
  for (const comm::Link& run : runs)
    if ((run.*which).size() != curve.size())
      throw UsageError("calibrate: link calibrations of different sizes cannot be merged");
  for (size_t i = 0; i < curve.size(); ++i) {
    std::vector<double> seconds;
    for (const comm::Link& run : runs) {
      if ((run.*which)[i].bytes != curve[i].bytes)
        throw UsageError("calibrate: link calibrations of different sizes cannot be merged");
      seconds.push_back((run.*which)[i].seconds);
    }
    curve[i].seconds = *std::min_element(seconds.begin(), seconds.end());
  }
  for (size_t i = curve.size(); i-- > 1;) curve[i - 1].seconds = std::min(curve[i - 1].seconds, curve[i].seconds);
  return curve;
}

// comm::calibrate_link over `ranks` threads of this process, each with its own Gloo communicator over a loopback
// rendezvous: the same TCP path two rank processes take. Every rank returns the same link.
comm::Link measure_host_link(int ranks, const comm::CalibrationOptions& options, double timeout_s) {
  if (ranks < 2) throw UsageError("calibrate: the link needs at least 2 ranks, not " + std::to_string(ranks));
  const comm::Millis timeout(static_cast<int64_t>(timeout_s * 1000));
  auto host = comm::Rendezvous::host("127.0.0.1", 0, ranks, timeout, /*rank=*/0);
  std::vector<std::future<void>> others;
  for (int r = 1; r < ranks; ++r) {
    others.push_back(std::async(std::launch::async, [&, r] {
      auto rendezvous = comm::Rendezvous::connect("127.0.0.1", host->port(), r, ranks, timeout);
      auto c = comm::make_gloo_communicator(rendezvous, r, ranks, timeout, "calibrate");
      comm::calibrate_link(*c, options);
    }));
  }
  auto c = comm::make_gloo_communicator(host, 0, ranks, timeout, "calibrate");
  const comm::Link link = comm::calibrate_link(*c, options);
  for (auto& f : others) f.get();  // rethrows a peer's failure
  return link;
}

// One rank's share of measure_host_allreduce: every size, warm-up rounds then timed ones; rank 0 keeps medians.
std::vector<comm::Sample> time_allreduce(comm::Communicator& c, const std::vector<int64_t>& sizes, int rounds,
                                         at::ScalarType dtype) {
  std::vector<comm::Sample> curve;
  const int64_t element = dtype == at::kFloat ? 4 : 2;
  for (int64_t bytes : sizes) {
    at::Tensor t = at::ones({std::max<int64_t>(1, bytes / element)}, dtype);
    std::vector<double> seconds;
    const int n = bytes >= (1 << 20) ? std::max(5, rounds / 4) : rounds;
    for (int i = 0; i < n + 3; ++i) {
      c.barrier()->wait();
      const auto t0 = Clock::now();
      c.all_reduce(t, comm::ReduceOp::Sum)->wait();
      if (i >= 3) seconds.push_back(seconds_since(t0));
    }
    curve.push_back({static_cast<double>(t.numel() * element), median_of(seconds)});
  }
  return curve;
}

// The all-reduce training runs between ranks of this host: Gloo communicators (threads, loopback) wrapped in the
// shared-memory path, as `comm.shared_memory = true` (the default) sets it up for a same-host group.
std::vector<comm::Sample> measure_host_allreduce(int ranks, int rounds, double timeout_s, at::ScalarType dtype) {
  const std::vector<int64_t> sizes{4, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20};
  const comm::Millis timeout(static_cast<int64_t>(timeout_s * 1000));
  auto host = comm::Rendezvous::host("127.0.0.1", 0, ranks, timeout, /*rank=*/0);
  std::vector<std::future<void>> others;
  for (int r = 1; r < ranks; ++r)
    others.push_back(std::async(std::launch::async, [&, r] {
      auto rendezvous = comm::Rendezvous::connect("127.0.0.1", host->port(), r, ranks, timeout);
      auto c = comm::with_shared_memory(comm::make_gloo_communicator(rendezvous, r, ranks, timeout, "calibrate-ar"));
      time_allreduce(*c, sizes, rounds, dtype);
    }));
  auto c = comm::with_shared_memory(comm::make_gloo_communicator(host, 0, ranks, timeout, "calibrate-ar"));
  std::vector<comm::Sample> curve = time_allreduce(*c, sizes, rounds, dtype);
  for (auto& f : others) f.get();
  return curve;
}

// Watts of the host's RAPL packages (their power limits, summed); 0 when powercap cannot be read.
double read_rapl_package_watts() {
  double watts = 0;
  for (int package = 0; package < 64; ++package) {
    std::ifstream in("/sys/class/powercap/intel-rapl:" + std::to_string(package) + "/constraint_0_power_limit_uw");
    double microwatts = 0;
    if (!(in >> microwatts)) break;
    watts += microwatts / 1e6;
  }
  return watts;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

void say(bool on, const char* format, double a = 0, double b = 0) {
  if (!on) return;
  std::fprintf(stderr, format, a, b);
  std::fflush(stderr);
}

}  // namespace

comm::Link merge_link_calibrations(const std::vector<comm::Link>& runs) {
  if (runs.empty()) throw UsageError("calibrate: no link calibration to merge");
  comm::Link link = runs[0];
  link.one_way_curve = merged_curve(runs, &comm::Link::one_way_curve);
  link.exchange_curve = merged_curve(runs, &comm::Link::exchange_curve);
  link.reduce_curve = merged_curve(runs, &comm::Link::reduce_curve);
  if (link.one_way_curve.size() >= 2) {
    const comm::Link fit = comm::fit_link(link.one_way_curve);
    link.latency_s = fit.latency_s;
    link.bandwidth_Bps = fit.bandwidth_Bps;
  }
  if (link.exchange_curve.size() >= 2) {
    const comm::Link fit = comm::fit_link(link.exchange_curve);
    link.exchange_latency_s = std::max(fit.latency_s, 1e-9);  // 0 would mean "as one way"
    link.exchange_bandwidth_Bps = fit.bandwidth_Bps;
  }
  if (!link.reduce_curve.empty() && link.reduce_curve.back().seconds > 0)
    link.reduce_Bps = link.reduce_curve.back().bytes / link.reduce_curve.back().seconds;
  return link;
}

std::vector<GemmGridShape> default_gemm_grid() {
  std::vector<GemmGridShape> grid;
  for (int64_t s : {32, 64, 128, 256, 512, 1024}) grid.push_back({s, s, s});
  // The attention's per-head products (T x head_dim x T and T x T x head_dim).
  grid.push_back({128, 32, 128});
  grid.push_back({128, 128, 32});
  // Tokens x hidden products (forward and input gradient) and hidden x tokens x hidden (weight gradient).
  for (int64_t m : {64, 256, 1024, 2048})
    for (int64_t k : {128, 512})
      for (int64_t n : {128, 512, 2048}) grid.push_back({m, k, n});
  grid.push_back({128, 2048, 128});
  grid.push_back({128, 2048, 512});
  grid.push_back({512, 2048, 512});
  return grid;
}

std::vector<GemmPoint> gemm_curve(std::vector<GemmPoint> points) {
  std::sort(points.begin(), points.end(), [](const GemmPoint& a, const GemmPoint& b) { return a.flops < b.flops; });
  std::vector<GemmPoint> curve;
  for (size_t i = 0; i < points.size();) {
    size_t j = i;
    std::vector<double> rates;
    for (; j < points.size() && points[j].flops == points[i].flops; ++j) rates.push_back(points[j].flops_per_s);
    curve.push_back({points[i].flops, median_of(rates)});
    i = j;
  }
  return curve;
}

double parse_meminfo_total(const std::string& meminfo) {
  std::istringstream lines(meminfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string key;
    double kib = 0;
    if (fields >> key >> kib && key == "MemTotal:") return kib * 1024;
  }
  return 0;
}

planner::ClusterFile describe_host(const HostMeasurements& m, double watts_per_core_assumed) {
  if (m.cores < 1) throw UsageError("calibrate: " + std::to_string(m.cores) + " cores; a host has at least one");
  planner::DeviceType cpu;
  cpu.name = "cpu";
  for (const auto& [dtype, points] : m.gemm) {
    if (points.empty()) throw UsageError("calibrate: no GEMM point measured in " + dtype);
    cpu.gemm_curve[dtype] = gemm_curve(points);
    double best = 0;
    for (const GemmPoint& p : points) best = std::max(best, p.flops_per_s);
    cpu.peak_flops[dtype] = best;
  }
  planner::ClusterSpec cluster;
  cluster.name = m.hostname;
  cluster.device = cpu.name;
  cluster.hosts = 1;
  cluster.devices_per_host = 2 * m.cores;
  cluster.compute_slots_per_host = m.cores;
  cluster.host_link = m.link;
  cluster.host_allreduce_curve = m.host_allreduce;
  cluster.host_allreduce_bf16_curve = m.host_allreduce_bf16;
  cluster.host_allreduce_ranks = m.host_allreduce_ranks;
  cluster.cluster_link = m.link;
  cpu.memory_bytes = m.total_memory_bytes / cluster.devices_per_host;
  cpu.memory_bandwidth_Bps = m.memory_bandwidth_Bps;
  cpu.kernel_overhead_s = m.kernel_overhead_s;
  // Communication on a CPU host runs on the same cores as the computation: none of it comes for free.
  cpu.comm_overlap = 0;
  const double host_w = m.host_power_w > 0 ? m.host_power_w : watts_per_core_assumed * m.cores;
  cpu.power_w = host_w / cluster.devices_per_host;
  cpu.price_per_hour = 0;
  planner::ClusterFile file;
  file.name = m.hostname;
  file.devices[cpu.name] = cpu;
  file.clusters.push_back(cluster);
  file.wan = m.link;  // a placeholder: one host has no wide-area link
  return file;
}

namespace {

void add_compute_factors(planner::ClusterFile& file, const CalibrateOptions& o) {
  // A shape of its own (not gpt-tiny's, which make bench-plan validates): 3 layers, width 192, 6 heads.
  models::GPTConfig reference;
  reference.n_layer = 3, reference.n_embd = 192, reference.n_head = 6, reference.block_size = 128;
  reference.vocab_size = 512;
  planner::DeviceType& cpu = file.devices.at(file.clusters.front().device);
  for (const std::string& dtype : o.dtypes) {
    planner::Layout one;
    one.micro_batch = 8, one.precision = dtype;
    cpu.compute_factor.erase(dtype);
    const planner::Estimate e = planner::estimate(planner::from_gpt_config(reference, "reference"), file, one);
    const double measured = reference_step_seconds(reference, one.micro_batch, dtype, 10 * o.seconds_per_point);
    cpu.compute_factor[dtype] = measured / e.time.compute_s;
    // The same reference on every core at once (one thread each, as ranks run): contention over alone.
    std::vector<std::future<double>> busy;
    for (int t = 0; t < file.clusters.front().compute_slots_per_host; ++t)
      busy.push_back(std::async(std::launch::async, [&] {
        return reference_step_seconds(reference, one.micro_batch, dtype, 10 * o.seconds_per_point);
      }));
    std::vector<double> times;
    for (auto& f : busy) times.push_back(f.get());
    cpu.contention[dtype] = std::max(1.0, median_of(times) / measured);
    if (o.progress)
      std::fprintf(stderr, "# calibrate: reference GPT (3 x 192, 8 x 128 tokens) %s: measured %.1f ms, modelled %.1f ms, "
                   "%.2fx with every core busy\n", dtype.c_str(), measured * 1e3, e.time.compute_s * 1e3,
                   cpu.contention[dtype]);
  }
}

}  // namespace

planner::ClusterFile calibrate_this_host(const CalibrateOptions& o) {
  if (!(o.seconds_per_point > 0)) throw UsageError("calibrate: seconds_per_point must be positive");
  if (o.shapes.empty()) throw UsageError("calibrate: no GEMM shape to measure");
  limit_compute_threads(1);
  at::manual_seed(0);
  HostMeasurements m;
  m.hostname = comm::local_hostname();
  m.cores = comm::local_core_count();
  m.total_memory_bytes = parse_meminfo_total(read_file("/proc/meminfo"));
  m.host_power_w = read_rapl_package_watts();
  {
    at::NoGradGuard no_grad;
    for (const std::string& dtype : o.dtypes) {
      const at::ScalarType type = scalar_type(dtype);
      const auto t0 = Clock::now();
      for (const GemmGridShape& s : o.shapes) m.gemm[dtype].push_back({s.flops(), gemm_rate(s, type, o.seconds_per_point)});
      double best = 0;
      for (const GemmPoint& p : m.gemm[dtype]) best = std::max(best, p.flops_per_s);
      if (o.progress)
        std::fprintf(stderr, "# calibrate: GEMM %s, %zu shapes: best %.1f GFLOP/s (%.1f s)\n", dtype.c_str(),
                     o.shapes.size(), best / 1e9, seconds_since(t0));
    }
    m.memory_bandwidth_Bps = measure_memory_bandwidth(o.bandwidth_bytes, 4 * o.seconds_per_point);
    say(o.progress, "# calibrate: memory bandwidth %.2f GB/s (a = b + c)\n", m.memory_bandwidth_Bps / 1e9);
  }
  m.kernel_overhead_s = measure_kernel_overhead(o.overhead_ops, 4 * o.seconds_per_point);
  say(o.progress, "# calibrate: kernel overhead %.2f us per operator (forward or backward, with autograd)\n",
      m.kernel_overhead_s * 1e6);
  if (o.measure_links) {
    const auto t0 = Clock::now();
    std::vector<comm::Link> runs;
    for (int i = 0; i < std::max(1, o.link_repeats); ++i) runs.push_back(measure_host_link(o.ranks, o.link, o.link_timeout_s));
    m.link = merge_link_calibrations(runs);
    say(o.progress, "# calibrate: host link alpha %.1f us, %.2f GB/s one way", m.link.latency_s * 1e6,
        m.link.bandwidth_Bps / 1e9);
    say(o.progress, " (%.1f s)\n", seconds_since(t0));
    m.host_allreduce = measure_host_allreduce(o.ranks, 40, o.link_timeout_s, at::kFloat);
    m.host_allreduce_bf16 = measure_host_allreduce(o.ranks, 40, o.link_timeout_s, at::kBFloat16);
    m.host_allreduce_ranks = o.ranks;
    say(o.progress, "# calibrate: shared-memory all-reduce 1 MiB %.0f us, 16 MiB %.1f ms\n",
        comm::interpolate(m.host_allreduce, 1 << 20) * 1e6, comm::interpolate(m.host_allreduce, 16 << 20) * 1e3);
    say(o.progress, "# calibrate: bf16 all-reduce (the link's path) 1 MiB %.0f us, 16 MiB %.1f ms\n",
        comm::interpolate(m.host_allreduce_bf16, 1 << 20) * 1e6, comm::interpolate(m.host_allreduce_bf16, 16 << 20) * 1e3);
  } else {
    m.link = comm::default_host_link();
  }
  planner::ClusterFile file = describe_host(m, o.watts_per_core_assumed);
  if (o.reference_model) add_compute_factors(file, o);
  return file;
}

}  // namespace crosstrain::apps
