// Devices, hosts, clusters, links and prices: what the planner plans onto. Pure (TOML in and out).
//
// The file extends the topology format of comm/cost_model.h ([links.host], [links.cluster], [links.wan] and
// [[hosts]] still mean what they mean there) with device types, clusters given by counts, per-cluster links,
// wide-area links between named clusters, prices and power:
//
//   [devices.a100]
//   peak_tflops = { fp32 = 19.5, tf32 = 156, bf16 = 312, fp16 = 312 }
//   memory_gb = 80
//   memory_bandwidth_gbs = 2039        # GB/s (bytes), for the element-wise work
//   power_w = 400
//   gemm_efficiency = 0.6              # sustained fraction of peak on large products (when no gemm_curve)
//   price_per_hour = 2.0               # per device
//   kernel_overhead_us = 0             # per operator (eager dispatch on CPU)
//   comm_overlap = 1                   # fraction of gradient sync that can hide behind backward
//   gemm_curve = { fp32 = [[gflop, tflops], ...] }   # measured (crosstrain plan --calibrate)
//
//   [[clusters]]
//   name = "east"
//   device = "a100"
//   hosts = 128
//   devices_per_host = 8
//   [clusters.links.host]    latency_us = 2   bandwidth_gbps = 2400   # Gbit/s per device, inside a host (NVLink)
//   [clusters.links.cluster] latency_us = 5   bandwidth_gbps = 200    # per device, between hosts (InfiniBand)
//
//   currency = "USD"                   # of every price (ISO 4217; USD when absent)
//   [links.wan] latency_us = 25000 bandwidth_gbps = 10               # default between any two clusters
//   [[wan]] clusters = ["east", "west"]  latency_us = 40000  bandwidth_gbps = 1
//
// Without [[clusters]], the [[hosts]] of a topology file form the clusters (hosts of one cluster must have the same
// `ranks`, which become devices_per_host), with the device of `default_device` (or a CPU core when none is given).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "crosstrain/comm/cost_model.h"

namespace crosstrain::planner {

// One point of a measured GEMM curve: a product of `flops` floating-point operations ran at `flops_per_s`.
struct GemmPoint {
  double flops = 0, flops_per_s = 0;
};

struct DeviceType {
  std::string name = "device";
  std::map<std::string, double> peak_flops;  // FLOP/s by dtype: fp32, tf32, bf16, fp16
  double memory_bytes = 0;
  double memory_bandwidth_Bps = 0;  // 0: element-wise work is free
  double power_w = 0;
  double gemm_efficiency = 0.7;     // fraction of peak sustained by large products, when gemm_curve is empty
  double kernel_overhead_s = 0;     // per operator launched (CPU eager dispatch, GPU launch); 0: free
  // Fraction of the gradient synchronisation that may run hidden behind the backward: 1 for accelerators (copy
  // engines and NICs work beside the kernels), 0 for CPU ranks whose communication competes for the same cores.
  double comm_overlap = 1.0;
  double price_per_hour = 0;
  std::map<std::string, std::vector<GemmPoint>> gemm_curve;  // measured, by dtype, ascending flops
  // Measured step time of a reference model over the model's own prediction of it, by dtype (`plan --calibrate`
  // times our GPT at a reference shape): what products, passes and operators leave out (shape-dependent BLAS
  // rates, transcendental activations, allocator). Multiplies computation; 1 when absent.
  std::map<std::string, double> compute_factor;
  // The same reference timed on every compute slot of the host at once, over the time alone, by dtype: what
  // sharing memory bandwidth and caches with busy neighbours costs (CPU hosts). 1 when absent.
  std::map<std::string, double> contention;
  double factor(const std::string& dtype) const {
    auto it = compute_factor.find(dtype);
    return it == compute_factor.end() ? 1.0 : it->second;
  }
  double contention_factor(const std::string& dtype) const {
    auto it = contention.find(dtype);
    return it == contention.end() ? 1.0 : it->second;
  }

  // Peak FLOP/s in `dtype` (bf16 falls back to fp16 and then fp32; throws UsageError when none is given).
  double peak(const std::string& dtype) const;
  // Sustained FLOP/s of one product of `flops` in `dtype`: the measured curve (interpolated on log flops) when
  // there is one, else peak * gemm_efficiency.
  double gemm_rate(double flops, const std::string& dtype) const;
};

struct ClusterSpec {
  std::string name = "default";
  std::string device = "cpu";
  int hosts = 1;
  int devices_per_host = 1;
  // Compute units a host's devices share (CPU cores): ranks beyond it slow each other down by ranks / slots.
  // 0: every device computes on its own (accelerators).
  int compute_slots_per_host = 0;
  double price_per_device_hour = -1;  // < 0: the device type's price
  comm::Link host_link, cluster_link;  // inside a host; between hosts of this cluster
  // Measured float all-reduce among host_allreduce_ranks ranks of one host through the path training takes there
  // (shared memory, comm/backends/shm.h): whole-buffer bytes -> seconds. Empty: the link's point-to-point model.
  std::vector<comm::Sample> host_allreduce_curve;
  std::vector<comm::Sample> host_allreduce_bf16_curve;  // the same for bf16 buffers (which take the link's path)
  int host_allreduce_ranks = 2;

  int devices() const { return hosts * devices_per_host; }
};

struct WanLink {
  std::string a, b;
  comm::Link link;
};

struct ClusterFile {
  std::string name = "cluster";
  std::string currency = "USD";   // of every price_per_hour (top-level `currency`, an ISO 4217 code)
  std::map<std::string, DeviceType> devices;
  std::vector<ClusterSpec> clusters;
  comm::Link wan;                 // default between two clusters
  std::vector<WanLink> wan_links;  // overrides per pair

  int total_devices() const;
  const DeviceType& device_of(const ClusterSpec& c) const;  // throws UsageError for an unknown device name
  const comm::Link& wan_between(const std::string& a, const std::string& b) const;
  double price_per_device_hour(const ClusterSpec& c) const;
};

// Parses a cluster file; throws UsageError naming the file, the section and the key.
ClusterFile parse_cluster(const std::string& text, const std::string& origin);
ClusterFile load_cluster(const std::string& path);
// The TOML parse_cluster reads back (curves included).
std::string to_toml(const ClusterFile& cluster);

}  // namespace crosstrain::planner
