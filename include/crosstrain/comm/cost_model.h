// One latency + bandwidth cost model (alpha-beta, as NCCL's tuning model, plus a reduction rate gamma) for our
// collective algorithms, a topology of hosts, clusters and links, and the choice of algorithm per operation and
// size (algo=auto). The model and the topology file are pure; detect_local_topology describes this host and, when
// asked, calibrates the link with a quick ping-pong over a communicator. `crosstrain bench cost-model` prints the
// prediction next to the measurement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/comm/algorithms/collectives.h"

namespace crosstrain::comm {

// One measured point: a message of `bytes` took `seconds` (a median).
struct Sample {
  double bytes = 0, seconds = 0;
};

// The median of `values` (0 for none). Pure.
double median(std::vector<double> values);

// Seconds at `bytes` on a measured curve (points by ascending bytes): linear between points, the first point's
// time below it, the last segment's slope beyond the last point. Pure.
double interpolate(const std::vector<Sample>& curve, double bytes);

struct Link {
  double latency_s = 50e-6;        // alpha: per message
  double bandwidth_Bps = 1e9;      // 1/beta: bytes per second
  // A step where every rank sends and receives at once (ring, halving-doubling) can cost more than a one-way
  // message when the transport does not run both directions in parallel; 0 means "same as one way".
  double exchange_latency_s = 0;
  double exchange_bandwidth_Bps = 0;
  // gamma: bytes per second a rank combines (adds) received data into its buffer; 0 means free.
  double reduce_Bps = 0;
  // Measured curves (calibrate_link fills them): when present they replace the straight lines above, since on a
  // host the rate depends on the message size (messages that stay in cache move several times faster).
  std::vector<Sample> one_way_curve, exchange_curve, reduce_curve;

  double seconds(double bytes) const {
    return one_way_curve.empty() ? latency_s + bytes / bandwidth_Bps : interpolate(one_way_curve, bytes);
  }
  double exchange_seconds(double bytes) const {
    if (!exchange_curve.empty()) return interpolate(exchange_curve, bytes);
    if (exchange_latency_s <= 0 && exchange_bandwidth_Bps <= 0) return seconds(bytes);
    return (exchange_latency_s > 0 ? exchange_latency_s : latency_s) +
           bytes / (exchange_bandwidth_Bps > 0 ? exchange_bandwidth_Bps : bandwidth_Bps);
  }
  double reduce_seconds(double bytes) const {
    if (!reduce_curve.empty()) return interpolate(reduce_curve, bytes);
    return reduce_Bps > 0 ? bytes / reduce_Bps : 0.0;
  }
};

// Hosts grouped in clusters; three kinds of links. Read from TOML:
//   [links.host]    latency_us = 5     bandwidth_gbps = 40      (between ranks of one host)
//   [links.cluster] latency_us = 20    bandwidth_gbps = 10      (between hosts of one cluster)
//   [links.wan]     latency_us = 25000 bandwidth_gbps = 0.1     (between clusters)
//   [[hosts]] name = "a0" cluster = "east" ranks = 2 cores = 16
// Optional per link: exchange_latency_us, exchange_bandwidth_gbps, reduce_gbps (see Link).
struct Topology {
  struct Host {
    std::string name, cluster;
    int ranks = 1;
    int cores = 0;  // 0: unknown
  };
  std::vector<Host> hosts;
  Link host, cluster, wan;
  // Index into `hosts` of each rank (detect_local_topology(comm) fills it; empty when read from a file).
  std::vector<int> rank_host;

  int world_size() const;
  // The slowest link a collective over all ranks must cross.
  const Link& bottleneck() const;
  // Ranks per host when every host has the same count (for the hierarchical algorithm), else 0.
  int uniform_ranks_per_host() const;
  // Ranks per host when every host has the same count and, where rank_host is known, each host's ranks are
  // consecutive (the hierarchical algorithm's groups are consecutive ranks), else 0.
  int consecutive_ranks_per_host() const;
};

// Parses a topology file; throws UsageError naming the file and the key.
Topology load_topology(const std::string& path);
// The TOML that load_topology reads back (every link key, including the optional ones that are set).
std::string to_toml(const Topology& t);
// One host with `ranks` ranks and the given local link.
Topology local_topology(int ranks, Link local);

// --- this host ---------------------------------------------------------------------------------------------------

std::string local_hostname();
// CPUs this process may run on (its affinity mask), at least 1.
int local_core_count();
// Loopback TCP between two ranks of one host, as measured on these machines (Gloo, 2 cores): the link used when
// nothing was calibrated.
Link default_host_link();
// Pure: one host named `name` with `cores` CPUs and `ranks` ranks; every link is `link`.
Topology describe_local_host(const std::string& name, int cores, int ranks, const Link& link);
// This host (name, cores) with `ranks` ranks and the default link; no communication.
Topology detect_local_topology(int ranks);

struct CalibrationOptions {
  // Message bytes, smallest first: a geometric grid (x2) from 8 KiB to 24 MiB, and 4 B (the latency). Between
  // points the curves are straight lines; a coarser grid overstates mid sizes, where the curve bends.
  std::vector<int64_t> sizes{4,         8 << 10,   16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
                             1 << 20,   2 << 20,   4 << 20,  8 << 20,  16 << 20, 24 << 20};
  int rounds = 50;          // per size; a quarter for 1 MiB and more (at least 5)
  bool exchange = true;     // also measure ring-style exchanges (every rank sends and receives at once)
  bool reduce = true;       // also measure the local reduction rate (gamma)
  // Keep the measured points as curves (Link::*_curve) that the predictions read: the rate depends on the
  // message size (what fits in cache moves faster). Off: straight alpha-beta lines fitted to the points.
  bool curves = true;
  // Rotate through 8 MiB of buffers so that messages start cold (as gradients do) instead of reusing the same
  // bytes every round. Reused buffers make mid-size messages look 2-3x faster than inside a collective.
  bool cold = true;
};
// Pure: alpha and beta (latency_s, bandwidth_Bps) fitted to samples by least squares on relative error, so small
// and large messages weigh alike. Alpha is at least 0; throws UsageError for fewer than two distinct sizes.
Link fit_link(const std::vector<Sample>& samples);
// Collective over `c` (at least 2 ranks): ping-pong between ranks 0 and 1 (one-way), ring exchanges over all
// ranks, and the local reduction (a += b), each at every size, medians of `rounds`: the curves, and alpha, beta
// and gamma fitted to them (for display and topology files). Every rank returns the same link.
Link calibrate_link(Communicator& c, const CalibrationOptions& options = {});
// Collective over `c`: every rank's host name and core count (ranks with the same host name form a host, in
// order of first appearance), the default links, and with `calibrate` the measured link between ranks 0 and 1
// (as the host link when they share a host, else as the cluster link).
Topology detect_local_topology(Communicator& c, bool calibrate, const CalibrationOptions& options = {});

// --- predictions -------------------------------------------------------------------------------------------------

enum class Collective { AllReduce, ReduceScatter, AllGather, Broadcast };
const char* to_string(Collective op);

// Predicted seconds of `op` on `n` ranks over `link` with algorithm `a`; `bytes` is the whole buffer (the
// all-reduce and broadcast buffer, the reduce-scatter input, the all-gather output). Infinity for Builtin and
// Hierarchical (see predict_hierarchical).
double predict(Collective op, algo::Algorithm a, double bytes, int n, const Link& link);
double predict_all_reduce(algo::Algorithm a, double bytes, int n, const Link& link);
// Hierarchical over a topology: a binomial tree inside hosts, ring across host leaders.
double predict_hierarchical(Collective op, double bytes, const Topology& t);
double predict_hierarchical(double bytes, const Topology& t);  // all-reduce
// The algorithm with the lowest predicted time (ring, tree, hd; hierarchical when `hierarchical` allows it and the
// topology has several hosts with the same rank count).
algo::Algorithm choose_algorithm(Collective op, double bytes, const Topology& t, bool hierarchical = true);
algo::Algorithm choose_all_reduce(double bytes, const Topology& t);

}  // namespace crosstrain::comm
