#include "crosstrain/obs/metrics_server.h"

#include <httplib.h>

#include <cctype>
#include <cerrno>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "crosstrain/core/error.h"

namespace crosstrain::obs {
namespace {

// ---- the text format --------------------------------------------------------------------------------------

// Shortest text that reads back as the same double (so a scraped value equals the metrics.jsonl one), and the
// spellings Prometheus uses for the values that are not finite.
std::string number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buf, sizeof buf, "%.*g", precision, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  return buf;
}

std::string escaped(const std::string& text, bool quote) {
  std::string out;
  for (char ch : text) {
    if (ch == '\\') out += "\\\\";
    else if (ch == '\n') out += "\\n";
    else if (ch == '"' && quote) out += "\\\"";
    else out += ch;
  }
  return out;
}

// Metric and label names allow [a-zA-Z0-9_] (and no leading digit); anything else in a key becomes '_'.
std::string name_part(const std::string& key) {
  std::string out = key;
  for (char& ch : out)
    if (!std::isalnum(static_cast<unsigned char>(ch)) && ch != '_') ch = '_';
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out;
}

struct Family {
  std::string name, type, help;
};

// Builds the text family by family; a name already written is skipped (a key of `extra` that a fixed field took).
class Exposition {
 public:
  bool begin(const Family& f) {
    if (!written_.insert(f.name).second) return false;
    text_ += "# HELP " + f.name + " " + escaped(f.help, false) + "\n# TYPE " + f.name + " " + f.type + "\n";
    return true;
  }
  void sample(const std::string& name, const std::string& labels, const std::string& value) {
    text_ += name + (labels.empty() ? "" : "{" + labels + "}") + " " + value + "\n";
  }
  void single(const Family& f, const std::string& value) {
    if (begin(f)) sample(f.name, "", value);
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::set<std::string> written_;
};

void write_up(Exposition& out) {
  out.single({"crosstrain_up", "gauge", "1 while the training job serves metrics."}, "1");
}

// The metrics.jsonl keys whose families have names of their own; every other key is crosstrain_<key>.
Family family_of(const std::string& key) {
  static const std::map<std::string, Family> known = {
      {"tokens", {"crosstrain_tokens_total", "counter", "Tokens trained on since the run began."}},
      {"time_s", {"crosstrain_elapsed_seconds", "gauge", "Seconds since this process began training."}},
      {"wan_bytes", {"crosstrain_wan_bytes_total", "counter", "Bytes sent over the wide-area links so far."}},
      {"sync_exchanges", {"crosstrain_sync_exchanges_total", "counter", "Exchanges of the sync mode so far."}},
      {"peak_rss_bytes", {"crosstrain_peak_rss_bytes", "gauge", "Peak resident memory of rank 0, in bytes."}},
      {"straggler_score", {"crosstrain_straggler_score", "gauge",
                           "Busy time of each rank over the median (1: typical), from the last exchange."}},
      {"rank_busy_s", {"crosstrain_rank_busy_seconds", "gauge",
                       "Mean busy seconds per step of each rank, from the last exchange."}},
      {"straggler_rank", {"crosstrain_straggler_rank", "gauge", "The rank named a straggler (-1: none)."}},
  };
  if (auto it = known.find(key); it != known.end()) return it->second;
  std::string name = "crosstrain_" + name_part(key);
  if (name.size() > 2 && name.compare(name.size() - 2, 2, "_s") == 0) name += "econds";
  return {name, "gauge", "The metrics.jsonl field '" + key + "' of the last step."};
}

void write_fixed(Exposition& out, const StepMetrics& m) {
  out.single({"crosstrain_step", "gauge", "The last completed training step."}, std::to_string(m.step));
  out.single({"crosstrain_total_steps", "gauge", "train.steps: the step the run ends at."},
             std::to_string(m.total_steps));
  out.single({"crosstrain_loss", "gauge", "Training loss of the last step."}, number(m.loss));
  if (m.val_loss >= 0)
    out.single({"crosstrain_val_loss", "gauge", "Validation loss of the last validation."}, number(m.val_loss));
  out.single({"crosstrain_lr", "gauge", "Learning rate of the last step."}, number(m.lr));
  out.single({"crosstrain_grad_norm", "gauge", "Gradient norm of the last step (before clipping)."},
             number(m.grad_norm));
  out.single({"crosstrain_tokens_per_second", "gauge", "Tokens per second over all ranks in the last step."},
             number(m.tokens_per_s));
  out.single({"crosstrain_mfu", "gauge",
              "Model FLOPs utilization of the last step (0..1) against the measured per-thread GEMM peak."},
             number(m.mfu));
  out.single({"crosstrain_step_seconds", "gauge", "Wall time of the last step."}, number(m.step_time_s));
  out.single({"crosstrain_comm_seconds", "gauge", "Communication time of the last step, issue to completion."},
             number(m.comm_time_s));
  out.single({"crosstrain_exposed_comm_seconds", "gauge",
              "Seconds the training thread waited on communication in the last step."},
             number(m.exposed_comm_time_s));
}

void write_series(Exposition& out, const std::string& key, const std::vector<double>& values) {
  const Family f = family_of(key);
  if (!out.begin(f)) return;
  for (size_t rank = 0; rank < values.size(); ++rank)
    out.sample(f.name, "rank=\"" + std::to_string(rank) + "\"", number(values[rank]));
}

void write_labels(Exposition& out, const std::map<std::string, std::string>& labels) {
  if (labels.empty() || !out.begin({"crosstrain_info", "gauge", "Text fields of the run, as labels; always 1."}))
    return;
  std::string text;
  for (const auto& [key, value] : labels)
    text += (text.empty() ? "" : ",") + name_part(key) + "=\"" + escaped(value, true) + "\"";
  out.sample("crosstrain_info", text, "1");
}

}  // namespace

std::string prometheus_up_text() {
  Exposition out;
  write_up(out);
  return out.text();
}

std::string prometheus_text(const StepMetrics& m) {
  Exposition out;
  write_up(out);
  write_fixed(out, m);
  for (const auto& [key, value] : m.extra) out.single(family_of(key), number(value));
  for (const auto& [key, value] : m.counts) out.single(family_of(key), std::to_string(value));
  for (const auto& [key, values] : m.series) write_series(out, key, values);
  write_labels(out, m.labels);
  return out.text();
}

StepMetrics with_last_known(StepMetrics now, const StepMetrics& before) {
  if (now.val_loss < 0) now.val_loss = before.val_loss;
  now.extra.insert(before.extra.begin(), before.extra.end());  // insert keeps the keys `now` has
  now.counts.insert(before.counts.begin(), before.counts.end());
  now.labels.insert(before.labels.begin(), before.labels.end());
  now.series.insert(before.series.begin(), before.series.end());
  return now;
}

// ---- the server -------------------------------------------------------------------------------------------

struct MetricsServer::Impl {
  std::string host;
  int port = 0;
  httplib::Server server;
  std::thread thread;
  std::atomic<bool> listening_done{false};
  std::mutex mutex;  // guards the two below: the training thread publishes while the server thread serves
  std::string text = prometheus_up_text();
  StepMetrics last;

  std::string current() {
    std::lock_guard<std::mutex> lock(mutex);
    return text;
  }
};

namespace {

void configure(httplib::Server& server, const std::function<std::string()>& current) {
  // Two workers: scrapes are rare and small; the default pool would add a thread per core to a training process.
  server.new_task_queue = [] { return new httplib::ThreadPool(2); };
  // SO_REUSEADDR (a restarted run may bind while the last one's connections linger in TIME_WAIT), but not
  // httplib's default SO_REUSEPORT, with which a second run on the same port would share it instead of failing.
  server.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  // One request per connection and short timeouts, so that a connected client cannot hold up the destructor.
  server.set_keep_alive_max_count(1);
  server.set_keep_alive_timeout(1);
  server.set_read_timeout(1, 0);
  server.set_write_timeout(1, 0);
  server.Get("/metrics", [current](const httplib::Request&, httplib::Response& res) {
    res.set_content(current(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404) res.set_content("not found: " + req.path + "; the metrics are at /metrics\n", "text/plain");
  });
}

}  // namespace

MetricsServer::MetricsServer(const std::string& host, int port) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.host = host;
  configure(s.server, [&s] { return s.current(); });
  errno = 0;
  s.port = port == 0 ? s.server.bind_to_any_port(host) : (s.server.bind_to_port(host, port) ? port : -1);
  if (s.port <= 0) {
    const std::string cause = errno ? std::string(": ") + std::strerror(errno) : "";
    throw UsageError("metrics endpoint: cannot listen on " + host + ":" + std::to_string(port) + cause +
                     "; set obs.metrics_port to a free port (or 0 to turn the endpoint off), or obs.metrics_host "
                     "to an address of this machine");
  }
  s.thread = std::thread([&s] {
    s.server.listen_after_bind();
    s.listening_done = true;
  });
  // stop() does nothing until the accept loop runs: wait for it, so that the destructor can always end it.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!s.server.is_running() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsServer::~MetricsServer() {
  // stop() is lost if the accept loop has not started yet (a very slow start): ask until the loop is over.
  do {
    impl_->server.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  } while (!impl_->listening_done);
  impl_->thread.join();
}

int MetricsServer::port() const { return impl_->port; }

std::string MetricsServer::url() const {
  return "http://" + impl_->host + ":" + std::to_string(impl_->port) + "/metrics";
}

void MetricsServer::publish(const StepMetrics& m) {
  Impl& s = *impl_;
  StepMetrics merged = with_last_known(m, s.last);  // only this thread touches `last`
  std::string text = prometheus_text(merged);
  s.last = std::move(merged);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.text = std::move(text);
}

std::unique_ptr<MetricsServer> start_metrics_server(const ObsConfig& config, bool quiet) {
  if (config.metrics_port <= 0) return nullptr;
  auto server = std::make_unique<MetricsServer>(config.metrics_host, static_cast<int>(config.metrics_port));
  if (!quiet) {
    std::printf("metrics: %s\n", server->url().c_str());
    std::fflush(stdout);
  }
  return server;
}

}  // namespace crosstrain::obs
