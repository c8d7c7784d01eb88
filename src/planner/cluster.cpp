#include "crosstrain/planner/cluster.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"

namespace crosstrain::planner {
namespace {

// Reads one file's sections, naming the file and the section in every message.
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& where, const std::string& what) const {
    throw UsageError("cluster file '" + origin_ + "': " + where + ": " + what);
  }

  double number(const toml::table& t, const std::string& where, const char* key, double fallback,
                bool required = false) const {
    const toml::node* n = t.get(key);
    if (!n) {
      if (required) fail(where, std::string("needs ") + key + " (a number)");
      return fallback;
    }
    if (auto v = n->value<double>()) {
      if (*v < 0 || !std::isfinite(*v)) fail(where, std::string(key) + " must be a number >= 0");
      return *v;
    }
    fail(where, std::string(key) + " must be a number");
  }

  std::vector<comm::Sample> curve(const toml::table& t, const std::string& where, const char* key) const {
    std::vector<comm::Sample> out;
    const toml::array* a = t[key].as_array();
    if (!a) return out;
    for (const auto& e : *a) {
      const toml::array* pair = e.as_array();
      if (!pair || pair->size() != 2 || !(*pair)[0].value<double>() || !(*pair)[1].value<double>())
        fail(where, std::string(key) + " must be a list of [bytes, seconds] pairs");
      out.push_back({*(*pair)[0].value<double>(), *(*pair)[1].value<double>()});
    }
    return out;
  }

  comm::Link link(const toml::table& t, const std::string& where, const comm::Link& fallback) const {
    comm::Link l = fallback;
    l.latency_s = number(t, where, "latency_us", fallback.latency_s * 1e6) * 1e-6;
    const double gbps = number(t, where, "bandwidth_gbps", fallback.bandwidth_Bps * 8 / 1e9);
    if (gbps <= 0) fail(where, "bandwidth_gbps must be > 0");
    l.bandwidth_Bps = gbps * 1e9 / 8;
    l.exchange_latency_s = number(t, where, "exchange_latency_us", fallback.exchange_latency_s * 1e6) * 1e-6;
    l.exchange_bandwidth_Bps = number(t, where, "exchange_bandwidth_gbps", fallback.exchange_bandwidth_Bps * 8 / 1e9) * 1e9 / 8;
    l.reduce_Bps = number(t, where, "reduce_gbps", fallback.reduce_Bps * 8 / 1e9) * 1e9 / 8;
    if (t.contains("one_way_curve")) l.one_way_curve = curve(t, where, "one_way_curve");
    if (t.contains("exchange_curve")) l.exchange_curve = curve(t, where, "exchange_curve");
    if (t.contains("reduce_curve")) l.reduce_curve = curve(t, where, "reduce_curve");
    return l;
  }

  comm::Link link_in(const toml::table& parent, const std::string& where, const char* name,
                     const comm::Link& fallback) const {
    const toml::table* s = parent["links"][name].as_table();
    return s ? link(*s, where + " [links." + name + "]", fallback) : fallback;
  }

  DeviceType device(const std::string& name, const toml::table& t) const {
    const std::string where = "[devices." + name + "]";
    DeviceType dev;
    dev.name = name;
    const toml::table* peaks = t["peak_tflops"].as_table();
    if (!peaks || peaks->empty()) fail(where, "needs peak_tflops = { fp32 = ..., bf16 = ... } (TFLOP/s by dtype)");
    for (const auto& [dtype, value] : *peaks) {
      auto v = value.value<double>();
      if (!v || *v <= 0) fail(where, "peak_tflops." + std::string(dtype.str()) + " must be a number > 0");
      dev.peak_flops[std::string(dtype.str())] = *v * 1e12;
    }
    dev.memory_bytes = number(t, where, "memory_gb", 0, true) * 1e9;
    dev.memory_bandwidth_Bps = number(t, where, "memory_bandwidth_gbs", 0) * 1e9;
    dev.power_w = number(t, where, "power_w", 0);
    dev.gemm_efficiency = number(t, where, "gemm_efficiency", dev.gemm_efficiency);
    if (dev.gemm_efficiency <= 0 || dev.gemm_efficiency > 1) fail(where, "gemm_efficiency must be in (0, 1]");
    dev.kernel_overhead_s = number(t, where, "kernel_overhead_us", 0) * 1e-6;
    dev.comm_overlap = number(t, where, "comm_overlap", dev.comm_overlap);
    if (dev.comm_overlap > 1) fail(where, "comm_overlap must be in [0, 1]");
    dev.price_per_hour = number(t, where, "price_per_hour", 0);
    for (const char* key : {"compute_factor", "contention"})
      if (const toml::table* factors = t[key].as_table())
        for (const auto& [dtype, value] : *factors) {
          auto v = value.value<double>();
          if (!v || *v <= 0) fail(where, std::string(key) + "." + std::string(dtype.str()) + " must be a number > 0");
          (std::string(key) == "contention" ? dev.contention : dev.compute_factor)[std::string(dtype.str())] = *v;
        }
    if (const toml::table* curves = t["gemm_curve"].as_table()) {
      for (const auto& [dtype, value] : *curves) {
        const toml::array* a = value.as_array();
        if (!a) fail(where, "gemm_curve." + std::string(dtype.str()) + " must be a list of [gflop, tflops] pairs");
        std::vector<GemmPoint> points;
        for (const auto& e : *a) {
          const toml::array* pair = e.as_array();
          if (!pair || pair->size() != 2 || !(*pair)[0].value<double>() || !(*pair)[1].value<double>() ||
              *(*pair)[1].value<double>() <= 0)
            fail(where, "gemm_curve." + std::string(dtype.str()) + " must hold [gflop, tflops] pairs, tflops > 0");
          points.push_back({*(*pair)[0].value<double>() * 1e9, *(*pair)[1].value<double>() * 1e12});
        }
        std::sort(points.begin(), points.end(), [](const GemmPoint& a, const GemmPoint& b) { return a.flops < b.flops; });
        dev.gemm_curve[std::string(dtype.str())] = points;
      }
    }
    return dev;
  }

  ClusterSpec cluster(const toml::table& t, size_t index, const comm::Link& host, const comm::Link& between) const {
    const std::string where = "[[clusters]] #" + std::to_string(index + 1);
    ClusterSpec c;
    c.name = t["name"].value_or(std::string("cluster") + std::to_string(index));
    c.device = t["device"].value_or(std::string("cpu"));
    c.hosts = static_cast<int>(number(t, where, "hosts", 1));
    c.devices_per_host = static_cast<int>(number(t, where, "devices_per_host", 1));
    if (c.hosts < 1 || c.devices_per_host < 1) fail(where, "hosts and devices_per_host must be >= 1");
    c.compute_slots_per_host = static_cast<int>(number(t, where, "compute_slots_per_host", 0));
    c.price_per_device_hour = t.contains("price_per_device_hour")
                                  ? number(t, where, "price_per_device_hour", 0)
                                  : -1.0;
    c.host_link = link_in(t, where, "host", host);
    c.host_allreduce_curve = curve(t, where, "host_allreduce_curve");
    c.host_allreduce_bf16_curve = curve(t, where, "host_allreduce_bf16_curve");
    c.host_allreduce_ranks = static_cast<int>(number(t, where, "host_allreduce_ranks", 2));
    if (c.host_allreduce_ranks < 2) fail(where, "host_allreduce_ranks must be >= 2");
    c.cluster_link = link_in(t, where, "cluster", between);
    return c;
  }

 private:
  std::string origin_;
};

// A CPU core as the device when a topology file names none: conservative figures, meant to be replaced by
// `crosstrain plan --calibrate`.
DeviceType default_cpu() {
  DeviceType d;
  d.name = "cpu";
  d.peak_flops = {{"fp32", 50e9}, {"bf16", 20e9}};
  d.memory_bytes = 4e9;
  d.memory_bandwidth_Bps = 10e9;
  d.gemm_efficiency = 0.8;
  d.kernel_overhead_s = 10e-6;
  d.comm_overlap = 0;
  d.power_w = 10;
  return d;
}

// The clusters of a plain topology file: its [[hosts]] grouped by cluster name.
void clusters_from_hosts(const Reader& r, const toml::array& hosts, ClusterFile& out, const std::string& device,
                         const comm::Link& host, const comm::Link& between) {
  for (size_t i = 0; i < hosts.size(); ++i) {
    const toml::table* h = hosts[i].as_table();
    if (!h) r.fail("[[hosts]] #" + std::to_string(i + 1), "must be a table");
    const std::string cluster = (*h)["cluster"].value_or(std::string("default"));
    const int ranks = static_cast<int>((*h)["ranks"].value_or(int64_t{1}));
    const int cores = static_cast<int>((*h)["cores"].value_or(int64_t{0}));
    auto it = std::find_if(out.clusters.begin(), out.clusters.end(), [&](const ClusterSpec& c) { return c.name == cluster; });
    if (it == out.clusters.end()) {
      ClusterSpec c;
      c.name = cluster;
      c.device = (*h)["device"].value_or(device);
      c.hosts = 0;
      c.devices_per_host = ranks;
      c.compute_slots_per_host = cores;
      c.host_link = host;
      c.cluster_link = between;
      out.clusters.push_back(c);
      it = out.clusters.end() - 1;
    }
    if (it->devices_per_host != ranks)
      r.fail("[[hosts]] #" + std::to_string(i + 1), "hosts of cluster '" + cluster +
                                                       "' must have the same ranks (use [[clusters]] otherwise)");
    ++it->hosts;
  }
}

}  // namespace

double DeviceType::peak(const std::string& dtype) const {
  auto it = peak_flops.find(dtype);
  if (it == peak_flops.end() && dtype == "bf16") it = peak_flops.find("fp16");
  if (it == peak_flops.end()) it = peak_flops.find("fp32");
  if (it != peak_flops.end()) return it->second;
  throw UsageError("device '" + name + "' gives no peak_tflops for " + dtype + " (nor fp32)");
}

double DeviceType::gemm_rate(double flops, const std::string& dtype) const {
  auto it = gemm_curve.find(dtype);
  if (it == gemm_curve.end() || it->second.empty()) return peak(dtype) * gemm_efficiency;
  const auto& c = it->second;
  if (flops <= c.front().flops) return c.front().flops_per_s;
  if (flops >= c.back().flops) return c.back().flops_per_s;
  size_t i = 1;
  while (c[i].flops < flops) ++i;
  // Linear in log(flops): the curve's points are spaced geometrically.
  const double x = std::log(flops), x0 = std::log(c[i - 1].flops), x1 = std::log(c[i].flops);
  const double w = x1 > x0 ? (x - x0) / (x1 - x0) : 0.0;
  return c[i - 1].flops_per_s + w * (c[i].flops_per_s - c[i - 1].flops_per_s);
}

int ClusterFile::total_devices() const {
  int n = 0;
  for (const auto& c : clusters) n += c.devices();
  return n;
}

const DeviceType& ClusterFile::device_of(const ClusterSpec& c) const {
  auto it = devices.find(c.device);
  if (it == devices.end()) throw UsageError("cluster '" + c.name + "' names device '" + c.device +
                                            "', which has no [devices." + c.device + "] section");
  return it->second;
}

const comm::Link& ClusterFile::wan_between(const std::string& a, const std::string& b) const {
  for (const auto& w : wan_links)
    if ((w.a == a && w.b == b) || (w.a == b && w.b == a)) return w.link;
  return wan;
}

double ClusterFile::price_per_device_hour(const ClusterSpec& c) const {
  return c.price_per_device_hour >= 0 ? c.price_per_device_hour : device_of(c).price_per_hour;
}

ClusterFile parse_cluster(const std::string& text, const std::string& origin) {
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << "cluster file '" << origin << "' is not valid TOML: " << e.description() << " (line "
      << e.source().begin.line << ")";
    throw UsageError(s.str());
  }
  const Reader r(origin);
  ClusterFile out;
  out.name = root["name"].value_or(std::string("cluster"));
  out.currency = root["currency"].value_or(std::string("USD"));
  const bool iso_code = out.currency.size() == 3 && std::all_of(out.currency.begin(), out.currency.end(),
                                                                 [](char ch) { return ch >= 'A' && ch <= 'Z'; });
  if (!iso_code) r.fail("currency", "'" + out.currency + "' is not a currency code such as \"USD\" or \"EUR\"");
  const comm::Link host = r.link_in(root, "top level", "host", comm::Link{});
  const comm::Link between = r.link_in(root, "top level", "cluster", host);
  out.wan = r.link_in(root, "top level", "wan", between);

  if (const toml::table* devices = root["devices"].as_table())
    for (const auto& [name, value] : *devices) {
      const toml::table* t = value.as_table();
      if (!t) r.fail("[devices]", std::string(name.str()) + " must be a table");
      out.devices[std::string(name.str())] = r.device(std::string(name.str()), *t);
    }
  const std::string default_device = root["default_device"].value_or(std::string("cpu"));
  if (!out.devices.count(default_device) && default_device != "cpu")
    r.fail("default_device", "'" + default_device + "' has no [devices] section");

  if (const toml::array* clusters = root["clusters"].as_array()) {
    for (size_t i = 0; i < clusters->size(); ++i) {
      const toml::table* t = (*clusters)[i].as_table();
      if (!t) r.fail("[[clusters]]", "every entry must be a table");
      out.clusters.push_back(r.cluster(*t, i, host, between));
    }
  } else if (const toml::array* hosts = root["hosts"].as_array()) {
    clusters_from_hosts(r, *hosts, out, default_device, host, between);
  }
  if (out.clusters.empty()) r.fail("top level", "lists no [[clusters]] (nor [[hosts]])");
  for (const auto& c : out.clusters) {
    // A cluster's name goes into paths, scripts and the scheduler's state: it must be a name (core/names.h).
    if (!is_valid_name(c.name))
      r.fail("cluster '" + c.name.substr(0, 64) + "'", "the name must be 1 to 64 letters, digits, '.', '_' or '-', "
             "starting with a letter or a digit");
    // A CPU core stands in when a (topology) file names no device: conservative, meant to be calibrated.
    if (c.device == "cpu" && !out.devices.count("cpu")) out.devices.emplace("cpu", default_cpu());
    if (!out.devices.count(c.device))
      r.fail("cluster '" + c.name + "'", "names device '" + c.device + "', which has no [devices." + c.device + "] section");
  }

  if (const toml::array* wans = root["wan"].as_array()) {
    for (size_t i = 0; i < wans->size(); ++i) {
      const std::string where = "[[wan]] #" + std::to_string(i + 1);
      const toml::table* t = (*wans)[i].as_table();
      const toml::array* names = t ? (*t)["clusters"].as_array() : nullptr;
      if (!names || names->size() != 2 || !(*names)[0].value<std::string>() || !(*names)[1].value<std::string>())
        r.fail(where, "needs clusters = [\"a\", \"b\"]");
      WanLink w{*(*names)[0].value<std::string>(), *(*names)[1].value<std::string>(), r.link(*t, where, out.wan)};
      for (const std::string& n : {w.a, w.b})
        if (std::none_of(out.clusters.begin(), out.clusters.end(), [&](const ClusterSpec& c) { return c.name == n; }))
          r.fail(where, "names cluster '" + n + "', which is not listed");
      out.wan_links.push_back(w);
    }
  }
  return out;
}

ClusterFile load_cluster(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot read cluster file '" + path + "' (see clusters/ for examples, or write one with "
                            "`crosstrain plan --calibrate --out FILE`)");
  std::stringstream s;
  s << in.rdbuf();
  return parse_cluster(s.str(), path);
}

namespace {

toml::array curve_toml(const std::vector<comm::Sample>& curve) {
  toml::array a;
  for (const auto& s : curve) a.push_back(toml::array{s.bytes, s.seconds});
  return a;
}

toml::table link_toml(const comm::Link& l) {
  toml::table t{{"latency_us", l.latency_s * 1e6}, {"bandwidth_gbps", l.bandwidth_Bps * 8 / 1e9}};
  if (l.exchange_latency_s > 0) t.insert("exchange_latency_us", l.exchange_latency_s * 1e6);
  if (l.exchange_bandwidth_Bps > 0) t.insert("exchange_bandwidth_gbps", l.exchange_bandwidth_Bps * 8 / 1e9);
  if (l.reduce_Bps > 0) t.insert("reduce_gbps", l.reduce_Bps * 8 / 1e9);
  if (!l.one_way_curve.empty()) t.insert("one_way_curve", curve_toml(l.one_way_curve));
  if (!l.exchange_curve.empty()) t.insert("exchange_curve", curve_toml(l.exchange_curve));
  if (!l.reduce_curve.empty()) t.insert("reduce_curve", curve_toml(l.reduce_curve));
  return t;
}

}  // namespace

std::string to_toml(const ClusterFile& c) {
  toml::table devices;
  for (const auto& [name, d] : c.devices) {
    toml::table peaks;
    for (const auto& [dtype, v] : d.peak_flops) peaks.insert(dtype, v / 1e12);
    toml::table t{{"peak_tflops", peaks},
                  {"memory_gb", d.memory_bytes / 1e9},
                  {"memory_bandwidth_gbs", d.memory_bandwidth_Bps / 1e9},
                  {"power_w", d.power_w},
                  {"gemm_efficiency", d.gemm_efficiency},
                  {"kernel_overhead_us", d.kernel_overhead_s * 1e6},
                  {"comm_overlap", d.comm_overlap},
                  {"price_per_hour", d.price_per_hour}};
    if (!d.compute_factor.empty()) {
      toml::table factors;
      for (const auto& [dtype, v] : d.compute_factor) factors.insert(dtype, v);
      t.insert("compute_factor", factors);
    }
    if (!d.contention.empty()) {
      toml::table factors;
      for (const auto& [dtype, v] : d.contention) factors.insert(dtype, v);
      t.insert("contention", factors);
    }
    if (!d.gemm_curve.empty()) {
      toml::table curves;
      for (const auto& [dtype, points] : d.gemm_curve) {
        toml::array a;
        for (const auto& p : points) a.push_back(toml::array{p.flops / 1e9, p.flops_per_s / 1e12});
        curves.insert(dtype, a);
      }
      t.insert("gemm_curve", curves);
    }
    devices.insert(name, t);
  }
  toml::array clusters;
  for (const auto& k : c.clusters) {
    toml::table t{{"name", k.name}, {"device", k.device}, {"hosts", int64_t{k.hosts}},
                  {"devices_per_host", int64_t{k.devices_per_host}}};
    if (k.compute_slots_per_host > 0) t.insert("compute_slots_per_host", int64_t{k.compute_slots_per_host});
    if (k.price_per_device_hour >= 0) t.insert("price_per_device_hour", k.price_per_device_hour);
    if (!k.host_allreduce_curve.empty()) {
      t.insert("host_allreduce_curve", curve_toml(k.host_allreduce_curve));
      t.insert("host_allreduce_ranks", int64_t{k.host_allreduce_ranks});
      if (!k.host_allreduce_bf16_curve.empty()) t.insert("host_allreduce_bf16_curve", curve_toml(k.host_allreduce_bf16_curve));
    }
    t.insert("links", toml::table{{"host", link_toml(k.host_link)}, {"cluster", link_toml(k.cluster_link)}});
    clusters.push_back(t);
  }
  toml::table root{{"name", c.name}, {"currency", c.currency}, {"devices", devices}, {"clusters", clusters},
                   {"links", toml::table{{"wan", link_toml(c.wan)}}}};
  if (!c.wan_links.empty()) {
    toml::array wans;
    for (const auto& w : c.wan_links) {
      toml::table t = link_toml(w.link);
      t.insert("clusters", toml::array{w.a, w.b});
      wans.push_back(t);
    }
    root.insert("wan", wans);
  }
  std::ostringstream s;
  s << root << "\n";
  return s.str();
}

}  // namespace crosstrain::planner
