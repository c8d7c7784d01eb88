#include "crosstrain/comm/cost_model.h"

#include <ATen/ATen.h>
#include <sched.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/core/machine.h"

namespace crosstrain::comm {
namespace {

using Clock = std::chrono::steady_clock;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kCalibrationTag = (1 << 20) - 16;

double log2_ceil(int n) { return n <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(n))); }

int floor_pow2(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}

// Binomial scatter or gather of `bytes` in all over n ranks: on the critical path the root sends (or receives)
// half, a quarter, ... of the buffer: ceil(log2 n) messages, (n-1)/n of the bytes for a power of two.
double binomial_scatter(double bytes, int n, const Link& l) {
  double s = 0;
  for (int k = 1; (1 << (k - 1)) < n; ++k) s += l.seconds(bytes / (1 << k));
  return s;
}

// One phase of recursive halving or doubling over p = 2^k ranks: exchanges of S/2, S/4, ..., S/p.
double halving_phase(double bytes, int p, const Link& l) {
  double s = 0;
  for (int m = 2; m <= p; m *= 2) s += l.exchange_seconds(bytes / m);
  return s;
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

Link straight_line(double latency_s, double bandwidth_Bps) {
  Link l;
  l.latency_s = latency_s;
  l.bandwidth_Bps = bandwidth_Bps;
  return l;
}

int rounds_for(int64_t bytes, int rounds) { return bytes >= (1 << 20) ? std::max(5, rounds / 4) : std::max(5, rounds); }

}  // namespace

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t m = values.size() / 2;
  return values.size() % 2 ? values[m] : 0.5 * (values[m - 1] + values[m]);
}

double interpolate(const std::vector<Sample>& curve, double bytes) {
  if (curve.empty()) return 0.0;
  if (curve.size() == 1 || bytes <= curve.front().bytes) return curve.front().seconds;
  size_t i = 1;
  while (i + 1 < curve.size() && curve[i].bytes < bytes) ++i;
  const Sample &a = curve[i - 1], &b = curve[i];
  const double slope = b.bytes > a.bytes ? (b.seconds - a.seconds) / (b.bytes - a.bytes) : 0.0;
  return std::max(0.0, a.seconds + slope * (bytes - a.bytes));
}

// --- topology ----------------------------------------------------------------------------------------------------

int Topology::world_size() const {
  int n = 0;
  for (const auto& h : hosts) n += h.ranks;
  return n;
}

const Link& Topology::bottleneck() const {
  bool clusters = false, hosts_many = hosts.size() > 1;
  for (const auto& h : hosts)
    if (h.cluster != hosts.front().cluster) clusters = true;
  return clusters ? wan : hosts_many ? cluster : host;
}

int Topology::uniform_ranks_per_host() const {
  if (hosts.empty()) return 0;
  for (const auto& h : hosts)
    if (h.ranks != hosts.front().ranks) return 0;
  return hosts.front().ranks;
}

int Topology::consecutive_ranks_per_host() const {
  const int g = uniform_ranks_per_host();
  for (size_t q = 0; g > 0 && q < rank_host.size(); ++q)
    if (rank_host[q] != static_cast<int>(q) / g) return 0;
  return g;
}

Topology local_topology(int ranks, Link local) { return describe_local_host("localhost", 0, ranks, local); }

Topology describe_local_host(const std::string& name, int cores, int ranks, const Link& link) {
  if (ranks < 1) throw UsageError("a host needs at least one rank, got " + std::to_string(ranks));
  Topology t;
  t.hosts.push_back({name.empty() ? std::string("localhost") : name, "local", ranks, std::max(0, cores)});
  t.host = t.cluster = t.wan = link;
  return t;
}

Topology load_topology(const std::string& path) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw UsageError("topology file '" + path + "': " + std::string(e.description()));
  }
  Topology t;
  auto link = [&](const char* name, Link& out) {
    auto* section = table["links"][name].as_table();
    if (!section) throw UsageError("topology file '" + path + "' has no [links." + name + "] section");
    auto latency = (*section)["latency_us"].value<double>();
    auto bandwidth = (*section)["bandwidth_gbps"].value<double>();
    if (!latency || !bandwidth || *bandwidth <= 0 || *latency < 0)
      throw UsageError("topology file '" + path + "': [links." + name +
                       "] needs latency_us >= 0 and bandwidth_gbps > 0 (numbers)");
    out.latency_s = *latency * 1e-6;
    out.bandwidth_Bps = *bandwidth * 1e9 / 8;
    auto optional = [&](const char* key, double scale, double& field) {
      auto* node = section->get(key);
      if (!node) return;
      auto v = node->value<double>();
      if (!v || *v < 0)
        throw UsageError("topology file '" + path + "': [links." + name + "] " + key + " must be a number >= 0");
      field = *v * scale;
    };
    optional("exchange_latency_us", 1e-6, out.exchange_latency_s);
    optional("exchange_bandwidth_gbps", 1e9 / 8, out.exchange_bandwidth_Bps);
    optional("reduce_gbps", 1e9 / 8, out.reduce_Bps);
  };
  link("host", t.host);
  link("cluster", t.cluster);
  link("wan", t.wan);
  auto* hosts = table["hosts"].as_array();
  if (!hosts || hosts->empty()) throw UsageError("topology file '" + path + "' lists no [[hosts]]");
  for (auto& node : *hosts) {
    auto* h = node.as_table();
    if (!h) throw UsageError("topology file '" + path + "': every [[hosts]] entry must be a table");
    Topology::Host host;
    host.name = (*h)["name"].value_or(std::string("host") + std::to_string(t.hosts.size()));
    host.cluster = (*h)["cluster"].value_or(std::string("default"));
    host.ranks = static_cast<int>((*h)["ranks"].value_or(int64_t{1}));
    host.cores = static_cast<int>((*h)["cores"].value_or(int64_t{0}));
    if (host.ranks < 1) throw UsageError("topology file '" + path + "': host " + host.name + " needs ranks >= 1");
    if (host.cores < 0) throw UsageError("topology file '" + path + "': host " + host.name + " needs cores >= 0");
    t.hosts.push_back(host);
  }
  return t;
}

std::string to_toml(const Topology& t) {
  auto link = [](const Link& l) {
    toml::table s{{"latency_us", l.latency_s * 1e6}, {"bandwidth_gbps", l.bandwidth_Bps * 8 / 1e9}};
    if (l.exchange_latency_s > 0) s.insert("exchange_latency_us", l.exchange_latency_s * 1e6);
    if (l.exchange_bandwidth_Bps > 0) s.insert("exchange_bandwidth_gbps", l.exchange_bandwidth_Bps * 8 / 1e9);
    if (l.reduce_Bps > 0) s.insert("reduce_gbps", l.reduce_Bps * 8 / 1e9);
    return s;
  };
  toml::array hosts;
  for (const auto& h : t.hosts) {
    toml::table e{{"name", h.name}, {"cluster", h.cluster}, {"ranks", int64_t{h.ranks}}};
    if (h.cores > 0) e.insert("cores", int64_t{h.cores});
    hosts.push_back(std::move(e));
  }
  toml::table root{{"links", toml::table{{"host", link(t.host)}, {"cluster", link(t.cluster)}, {"wan", link(t.wan)}}},
                   {"hosts", std::move(hosts)}};
  std::ostringstream out;
  out << root << "\n";
  return out.str();
}

// --- this host ---------------------------------------------------------------------------------------------------

std::string local_hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

int local_core_count() { return usable_cores(); }

Link default_host_link() {
  // Gloo over loopback TCP between two ranks on 2 cores (bench cost-model): one-way messages ~150 us and
  // ~1.5 GB/s; ring-style exchanges are slower per step; adds run at several GB/s. No curves: straight lines.
  Link l = straight_line(150e-6, 1.5e9);
  l.exchange_latency_s = 250e-6;
  l.exchange_bandwidth_Bps = 1.2e9;
  l.reduce_Bps = 4e9;
  return l;
}

Topology detect_local_topology(int ranks) {
  return describe_local_host(local_hostname(), local_core_count(), ranks, default_host_link());
}

Link fit_link(const std::vector<Sample>& samples) {
  // Minimise sum(((alpha + beta x - y) / y)^2): weights 1/y^2.
  double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;
  for (const auto& s : samples) {
    if (!(s.seconds > 0) || s.bytes < 0) throw UsageError("fit_link: samples need seconds > 0 and bytes >= 0");
    const double w = 1.0 / (s.seconds * s.seconds);
    s0 += w, s1 += w * s.bytes, s2 += w * s.bytes * s.bytes, t0 += w * s.seconds, t1 += w * s.bytes * s.seconds;
  }
  const double det = s0 * s2 - s1 * s1;
  if (samples.size() < 2 || !(det > 1e-12 * s0 * s2))
    throw UsageError("fit_link: needs samples of at least two different sizes");
  double alpha = (t0 * s2 - s1 * t1) / det, b = (s0 * t1 - s1 * t0) / det;
  if (alpha < 0) alpha = 0, b = t1 / s2;            // through the origin
  if (!(b > 0)) b = 1e-12, alpha = (t0 - b * s1) / s0;  // no measurable bandwidth term: 1 TB/s
  Link l;
  l.latency_s = std::max(0.0, alpha);
  l.bandwidth_Bps = 1.0 / b;
  return l;
}

Link calibrate_link(Communicator& c, const CalibrationOptions& o) {
  const int n = c.size(), r = c.rank();
  if (n < 2) throw UsageError("calibrating a link needs at least 2 ranks");
  if (o.sizes.size() < 2 || !std::is_sorted(o.sizes.begin(), o.sizes.end()))
    throw UsageError("calibrating a link needs at least two message sizes, smallest first");
  std::vector<Sample> one_way, exchange, reduce;
  for (int64_t bytes : o.sizes) {
    const int64_t numel = std::max<int64_t>(1, bytes / 4);
    const double size = static_cast<double>(numel * 4);
    const int rounds = rounds_for(bytes, o.rounds);
    // With `cold`, rounds rotate through buffers that together exceed a core's cache, so messages start cold
    // (as gradients do) instead of reusing the same bytes every round (as a benchmark loop does).
    const int pool = o.cold ? static_cast<int>(std::clamp<int64_t>((8 << 20) / (numel * 4), 1, 64)) : 1;
    auto buffers = [&](float fill) {
      std::vector<at::Tensor> v;
      for (int i = 0; i < pool; ++i) v.push_back(at::full({numel}, fill));
      return v;
    };
    // Ping-pong between ranks 0 and 1: half a round trip, median over rounds (after two untimed ones).
    std::vector<at::Tensor> t = buffers(0);
    std::vector<double> times;
    c.barrier()->wait();
    for (int i = 0; r < 2 && i < rounds + 2; ++i) {
      at::Tensor& b = t[i % pool];
      const auto t0 = Clock::now();
      if (r == 0) {
        c.send(b, 1, kCalibrationTag)->wait();
        c.recv(b, 1, kCalibrationTag + 1)->wait();
      } else {
        c.recv(b, 0, kCalibrationTag)->wait();
        c.send(b, 0, kCalibrationTag + 1)->wait();
      }
      if (i >= 2) times.push_back(seconds_since(t0) / 2);
    }
    one_way.push_back({size, max_over_ranks(c, r == 0 ? median(times) : 0.0)});
    if (o.exchange) {
      // Every rank sends to its right while receiving from its left, as a ring step does.
      std::vector<at::Tensor> out = buffers(0), in = buffers(0);
      times.clear();
      c.barrier()->wait();
      for (int i = 0; i < rounds + 2; ++i) {
        const auto t0 = Clock::now();
        auto s = c.send(out[i % pool], (r + 1) % n, kCalibrationTag + 2);
        c.recv(in[i % pool], (r + n - 1) % n, kCalibrationTag + 2)->wait();
        s->wait();
        if (i >= 2) times.push_back(seconds_since(t0));
      }
      exchange.push_back({size, max_over_ranks(c, median(times))});
    }
    if (o.reduce) {
      // The combine step of a reduction: a += b on float buffers of the message's size.
      std::vector<at::Tensor> a = buffers(0), b = buffers(1);
      times.clear();
      for (int i = 0; i < rounds + 2; ++i) {
        const auto t0 = Clock::now();
        a[i % pool].add_(b[i % pool]);
        if (i >= 2) times.push_back(seconds_since(t0));
      }
      reduce.push_back({size, std::max(max_over_ranks(c, median(times)), 1e-9)});
    }
  }
  Link link = fit_link(one_way);
  if (o.curves) link.one_way_curve = one_way;
  if (o.exchange) {
    const Link e = fit_link(exchange);
    link.exchange_latency_s = std::max(e.latency_s, 1e-9);  // 0 would mean "as one way"
    link.exchange_bandwidth_Bps = e.bandwidth_Bps;
    if (o.curves) link.exchange_curve = exchange;
  }
  if (o.reduce) {
    // Gamma: the rate on the largest buffer.
    link.reduce_Bps = reduce.back().bytes / reduce.back().seconds;
    reduce.insert(reduce.begin(), Sample{0.0, 0.0});
    if (o.curves) link.reduce_curve = reduce;
  }
  return link;
}

Topology detect_local_topology(Communicator& c, bool calibrate, const CalibrationOptions& options) {
  const int n = c.size();
  constexpr int64_t kName = 64;
  const std::string me = local_hostname();
  at::Tensor name = at::zeros({kName}, at::kByte), names = at::zeros({kName * n}, at::kByte);
  std::copy_n(me.data(), std::min<size_t>(me.size(), kName - 1), static_cast<char*>(name.data_ptr()));
  c.all_gather(name, names)->wait();
  at::Tensor cores = at::full({1}, static_cast<int64_t>(local_core_count()), at::kLong);
  at::Tensor all_cores = at::zeros({n}, at::kLong);
  c.all_gather(cores, all_cores)->wait();
  Topology t;
  std::vector<int> host_of(n);
  for (int q = 0; q < n; ++q) {
    const char* p = static_cast<const char*>(names.data_ptr()) + q * kName;
    std::string host(p, strnlen(p, kName));
    auto it = std::find_if(t.hosts.begin(), t.hosts.end(), [&](const auto& h) { return h.name == host; });
    if (it == t.hosts.end()) {
      t.hosts.push_back({host, "local", 1, static_cast<int>(all_cores[q].item<int64_t>())});
      host_of[q] = static_cast<int>(t.hosts.size()) - 1;
    } else {
      ++it->ranks;
      host_of[q] = static_cast<int>(it - t.hosts.begin());
    }
  }
  t.rank_host = host_of;
  t.host = default_host_link();
  t.cluster = t.wan = straight_line(100e-6, 1.25e9);  // 10 Gb/s Ethernet until measured or described in a file
  if (calibrate && n >= 2) {
    const Link measured = calibrate_link(c, options);
    (host_of[0] == host_of[1] ? t.host : t.cluster) = measured;
    if (host_of[0] != host_of[1]) t.wan = measured;
  }
  return t;
}

// --- predictions -------------------------------------------------------------------------------------------------

const char* to_string(Collective op) {
  switch (op) {
    case Collective::AllReduce: return "allreduce";
    case Collective::ReduceScatter: return "reducescatter";
    case Collective::AllGather: return "allgather";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

double predict(Collective op, algo::Algorithm a, double S, int n, const Link& l) {
  if (n <= 1) return 0.0;
  const double L = log2_ceil(n);
  const int p = floor_pow2(n);
  const bool folds = p != n;
  // The all-gather copies the rank's own slice into the output, and the tree and halving-doubling reduce-scatter
  // copy the result slice out of scratch: a copy into a cold buffer streams about as much memory as an add.
  const double own_slice = l.reduce_seconds(S / n);
  switch (a) {
    case algo::Algorithm::Ring:
      switch (op) {
        // Exchange steps (send right while receiving from the left) of a 1/n slice; reductions add each received
        // slice into the buffer.
        case Collective::AllReduce: return 2.0 * (n - 1) * l.exchange_seconds(S / n) + (n - 1) * l.reduce_seconds(S / n);
        case Collective::ReduceScatter: return (n - 1) * (l.exchange_seconds(S / n) + l.reduce_seconds(S / n));
        case Collective::AllGather: return own_slice + (n - 1) * l.exchange_seconds(S / n);
        case Collective::Broadcast: {
          // Pipelined chain of k pieces (as the algorithm cuts them): n - 2 + k one-way messages of S/k on the
          // critical path.
          const double k = algo::ring_broadcast_segments(static_cast<int64_t>(S), n, 8);
          return (n - 2 + k) * l.seconds(S / k);
        }
      }
      break;
    case algo::Algorithm::Tree:
      switch (op) {
        case Collective::AllReduce: return 2.0 * L * l.seconds(S) + L * l.reduce_seconds(S);
        case Collective::ReduceScatter:
          return L * (l.seconds(S) + l.reduce_seconds(S)) + binomial_scatter(S, n, l) + own_slice;
        case Collective::AllGather: return own_slice + binomial_scatter(S, n, l) + L * l.seconds(S);
        case Collective::Broadcast: return L * l.seconds(S);
      }
      break;
    case algo::Algorithm::HalvingDoubling: {
      // log2 p exchanges per phase; the pieces halve (or double): (p-1)/p of the buffer per phase.
      const double phase = halving_phase(S, p, l);
      const double reduce = l.reduce_seconds((p - 1.0) / p * S);
      switch (op) {
        case Collective::AllReduce:
          return (folds ? 2.0 * l.seconds(S) + l.reduce_seconds(S) : 0.0) + 2.0 * phase + reduce;
        case Collective::ReduceScatter:
          return (folds ? l.seconds(S) + l.reduce_seconds(S) + l.seconds(S / n) : 0.0) + phase + reduce + own_slice;
        case Collective::AllGather: return own_slice + (folds ? l.seconds(S / n) + l.seconds(S) : 0.0) + phase;
        case Collective::Broadcast: return binomial_scatter(S, p, l) + phase + (folds ? l.seconds(S) : 0.0);
      }
      break;
    }
    default: break;
  }
  return kInf;
}

double predict_all_reduce(algo::Algorithm a, double bytes, int n, const Link& l) {
  return predict(Collective::AllReduce, a, bytes, n, l);
}

double predict_hierarchical(Collective op, double S, const Topology& t) {
  const int g = t.uniform_ranks_per_host();
  if (g == 0) return kInf;
  const int hosts = static_cast<int>(t.hosts.size());
  const Link& in = t.host;
  const Link& across = t.bottleneck();
  const double L = log2_ceil(g);
  const auto ring = [&](Collective c) { return predict(c, algo::Algorithm::Ring, S, hosts, across); };
  switch (op) {
    case Collective::AllReduce:
      return (g > 1 ? 2.0 * L * in.seconds(S) + L * in.reduce_seconds(S) : 0.0) + ring(op);
    case Collective::ReduceScatter:
      return (g > 1 ? L * (in.seconds(S) + in.reduce_seconds(S)) + binomial_scatter(S / hosts, g, in) : 0.0) + ring(op);
    case Collective::AllGather:
      return (g > 1 ? binomial_scatter(S / hosts, g, in) + L * in.seconds(S) : 0.0) + ring(op);
    case Collective::Broadcast:
      return (g > 1 ? in.seconds(S) + L * in.seconds(S) : 0.0) + ring(op);
  }
  return kInf;
}

double predict_hierarchical(double bytes, const Topology& t) {
  return predict_hierarchical(Collective::AllReduce, bytes, t);
}

algo::Algorithm choose_algorithm(Collective op, double bytes, const Topology& t, bool hierarchical) {
  const int n = t.world_size();
  algo::Algorithm best = algo::Algorithm::Ring;
  double best_time = kInf;
  for (auto a : {algo::Algorithm::Ring, algo::Algorithm::Tree, algo::Algorithm::HalvingDoubling}) {
    const double s = predict(op, a, bytes, n, t.bottleneck());
    if (s < best_time) best = a, best_time = s;
  }
  if (hierarchical && t.hosts.size() > 1 && predict_hierarchical(op, bytes, t) < best_time)
    best = algo::Algorithm::Hierarchical;
  return best;
}

algo::Algorithm choose_all_reduce(double bytes, const Topology& t) {
  return choose_algorithm(Collective::AllReduce, bytes, t);
}

}  // namespace crosstrain::comm
