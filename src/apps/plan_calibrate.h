// `crosstrain plan --calibrate`: measures this host as one training rank sees it (one intra-op thread, one
// OpenBLAS thread) and describes it as a cluster file (planner/cluster.h) the planner reads back:
//
//   planner::ClusterFile host = calibrate_this_host({});
//   write planner::to_toml(host) to --out
//
// What each field of the description means, and how it was measured:
//  - devices.cpu.gemm_curve[fp32|bf16]: (FLOPs of one product, FLOP/s) over a grid of m x k x n products (squares
//    from 32^3 to 1024^3, the model's tall-thin tokens x hidden products and their weight-gradient forms, the
//    attention's T x head_dim products, up to 2048x512x2048), ascending by FLOPs; shapes of equal FLOPs are merged
//    into their median rate. Each shape: a warm-up of seconds_per_point / 2, then the better of two timed runs of
//    seconds_per_point (as jobs/gpt/peak_flops.cpp times the MFU denominator). peak_flops[dtype]: the best point.
//  - memory_bandwidth_Bps: bytes read and written per second by one thread's a = b + c on float tensors of
//    bandwidth_bytes each (3 x bandwidth_bytes per operation), the median of several operations: out of cache.
//  - kernel_overhead_s: seconds per operator of eager libtorch with autograd on tiny tensors. A chain of
//    overhead_ops operators (alternately x * s and tanh(x)) on a 16-element tensor that requires grad, then its
//    backward; the time of forward + backward divided by 2 x overhead_ops (each forward operator and its backward
//    node count once). So it is the dispatch, autograd-graph and backward-engine cost of one operator, forward or
//    backward, with the arithmetic negligible: the time a step spends beyond FLOPs and bytes, per operator run.
//  - clusters[0].host_link: comm::calibrate_link between `ranks` ranks of this host (threads of this process, each
//    with its own Gloo communicator over loopback TCP, as two rank processes talk), link_repeats times, merged by
//    merge_link_calibrations: the one-way (send/recv ping-pong), ring-exchange and reduction curves (threads measured alpha 51 us, 3.4 GB/s where `bench
//    cost-model --nproc 2` measured 48 us, 3.3 GB/s). Gloo's point-to-point path, not the shared-memory
//    all-reduce (comm.shared_memory) a same-host training run uses for float all-reduces.
//  - clusters[0].cluster_link = host_link (one host), and wan = host_link: a placeholder so the file is complete;
//    replace it with the real wide-area link (or add [[wan]] entries) when planning across clusters.
//  - one cluster named after the host, hosts = 1, device "cpu", devices_per_host = 2 x cores (two ranks per core
//    is the most that pays here), compute_slots_per_host = cores (the affinity mask's CPUs), memory_bytes =
//    MemTotal / devices_per_host.
//  - power_w (per device) = the host's power / devices_per_host, the host's power being the sum of the RAPL
//    package power limits (/sys/class/powercap/intel-rapl:N/constraint_0_power_limit_uw) when readable, else an
//    assumption of watts_per_core_assumed x cores (10 W per core: no measurement; say so where it matters).
//    price_per_hour = 0 (a host of our own).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "crosstrain/comm/cost_model.h"
#include "crosstrain/planner/cluster.h"

namespace crosstrain::apps {

// One product x [m, k] times w [k, n].
struct GemmGridShape {
  int64_t m = 0, k = 0, n = 0;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n); }
};

// The grid described above (about 30 shapes, 1e5 to 4.3e9 FLOPs).
std::vector<GemmGridShape> default_gemm_grid();

struct CalibrateOptions {
  std::string out_path;               // where `plan --calibrate` writes the file (the caller writes it)
  double seconds_per_point = 0.05;    // per GEMM shape: warm-up half of this, then the better of two such runs
  int ranks = 2;                      // ranks (threads) the link calibration runs over; at least 2
  std::vector<std::string> dtypes{"fp32", "bf16"};
  std::vector<GemmGridShape> shapes = default_gemm_grid();
  int64_t bandwidth_bytes = int64_t{64} << 20;  // each of a, b, c in a = b + c
  int overhead_ops = 200;             // operators in the chain that kernel_overhead_s is timed on
  bool measure_links = true;          // false: comm::default_host_link() (no communication; quick tests)
  comm::CalibrationOptions link;      // sizes and rounds of the link calibration
  int link_repeats = 3;               // calibrations merged by merge_link_calibrations (a shared machine is noisy)
  double link_timeout_s = 60;
  double watts_per_core_assumed = 10;  // when RAPL cannot be read
  bool progress = true;               // one line per phase on stderr
  bool reference_model = true;        // also time a reference GPT: the device's compute_factor per dtype
};

// What calibrate_this_host measured, before it becomes a cluster description.
struct HostMeasurements {
  std::string hostname;
  int cores = 1;
  double total_memory_bytes = 0;       // MemTotal; 0 when unknown
  double host_power_w = 0;             // RAPL's package limits summed; 0 when unknown
  std::map<std::string, std::vector<planner::GemmPoint>> gemm;  // by dtype, as measured (any order)
  double memory_bandwidth_Bps = 0;
  double kernel_overhead_s = 0;
  comm::Link link;
  // Float all-reduce of the whole buffer among `ranks` ranks through the shared-memory path a same-host training
  // run takes (comm::with_shared_memory over Gloo): bytes -> seconds, the median of rounds per size.
  std::vector<comm::Sample> host_allreduce;
  std::vector<comm::Sample> host_allreduce_bf16;  // the same for bf16 buffers (Gloo's path: no shared memory)
  int host_allreduce_ranks = 2;
};

// Pure: points sorted by ascending FLOPs, points of equal FLOPs merged into one with their median rate.
std::vector<planner::GemmPoint> gemm_curve(std::vector<planner::GemmPoint> points);
// Pure: one link from several calibrations of it (same sizes): each curve the per-size minimum over them (each
// point is already a median of rounds; on a shared machine whole calibrations run 2 ms slower per message when
// other processes keep both cores busy, and interference only ever adds time), then made non-decreasing in
// seconds from the largest size down (a point slower than a larger message is interference too: a bigger message
// never takes less time), alpha-beta lines refitted to the merged curves, gamma from the largest reduction.
// Throws UsageError for none or for calibrations of different sizes.
comm::Link merge_link_calibrations(const std::vector<comm::Link>& runs);
// Pure: MemTotal of a /proc/meminfo text in bytes, 0 when absent.
double parse_meminfo_total(const std::string& meminfo);
// Pure: the cluster file of one host (see the header comment for every field). Throws UsageError when a dtype
// has no point or cores < 1.
planner::ClusterFile describe_host(const HostMeasurements& m, double watts_per_core_assumed = 10);

// Measures this host (about 20 s with the defaults, 6-10 s of it the three link calibrations) and
// describes it. Limits this process to one compute thread (as a training rank runs) and leaves it so.
planner::ClusterFile calibrate_this_host(const CalibrateOptions& options);

}  // namespace crosstrain::apps
