// One latency + bandwidth cost model (alpha-beta, as NCCL's tuning model) for our collective algorithms, a
// topology of hosts, clusters and links, and the choice of algorithm per operation and size (algo=auto).
// Pure: no communication. `crosstrain bench cost-model` calibrates alpha and beta on the real link and prints the
// prediction next to the measurement.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/comm/algorithms.h"

namespace crosstrain::comm {

struct Link {
  double latency_s = 50e-6;        // alpha: per message
  double bandwidth_Bps = 1e9;      // 1/beta: bytes per second
  // A step where every rank sends and receives at once (ring, halving-doubling) can cost more than a one-way
  // message when the transport does not run both directions in parallel; 0 means "same as one way".
  double exchange_latency_s = 0;
  double exchange_bandwidth_Bps = 0;
  double seconds(double bytes) const { return latency_s + bytes / bandwidth_Bps; }
  double exchange_seconds(double bytes) const {
    return (exchange_latency_s > 0 ? exchange_latency_s : latency_s) +
           bytes / (exchange_bandwidth_Bps > 0 ? exchange_bandwidth_Bps : bandwidth_Bps);
  }
};

// Hosts grouped in clusters; three kinds of links. Read from TOML:
//   [links.host]    latency_us = 5     bandwidth_gbps = 40      (between ranks of one host)
//   [links.cluster] latency_us = 20    bandwidth_gbps = 10      (between hosts of one cluster)
//   [links.wan]     latency_us = 25000 bandwidth_gbps = 0.1     (between clusters)
//   [[hosts]] name = "a0" cluster = "east" ranks = 2
struct Topology {
  struct Host {
    std::string name, cluster;
    int ranks = 1;
  };
  std::vector<Host> hosts;
  Link host, cluster, wan;

  int world_size() const;
  // The slowest link a collective over all ranks must cross.
  const Link& bottleneck() const;
  // Ranks per host when every host has the same count (for the hierarchical algorithm), else 0.
  int uniform_ranks_per_host() const;
};

// Parses a topology file; throws UsageError naming the file and the key.
Topology load_topology(const std::string& path);
// One host with `ranks` ranks and the given local link.
Topology local_topology(int ranks, Link local);

// Predicted seconds of an all-reduce of `bytes` on `n` ranks over `link` with algorithm `a`.
double predict_all_reduce(algo::Algorithm a, double bytes, int n, const Link& link);
// Hierarchical over a topology: reduce inside hosts, ring across host leaders, broadcast inside.
double predict_hierarchical(double bytes, const Topology& t);
// The algorithm with the lowest predicted time (ring, tree, hd; hierarchical when the topology has several
// hosts with the same rank count).
algo::Algorithm choose_all_reduce(double bytes, const Topology& t);

}  // namespace crosstrain::comm
