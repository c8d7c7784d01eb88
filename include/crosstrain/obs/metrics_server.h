// Live metrics: rank 0 serves the latest step's metrics in the Prometheus text exposition format (0.0.4) on
// http://obs.metrics_host:obs.metrics_port/metrics, so a Prometheus server (or curl) can watch a run as it trains.
// The text is rendered once per step on the training thread; a background thread only hands out the last copy.
#pragma once

#include <memory>
#include <string>

#include "crosstrain/obs/config.h"
#include "crosstrain/obs/step_log.h"

namespace crosstrain::obs {

// What the endpoint serves before the first step: `crosstrain_up 1` and nothing that looks like a step.
std::string prometheus_up_text();
// `crosstrain_up 1` followed by one family per field of `m` (# HELP, # TYPE, samples); the fixed fields under
// fixed names (crosstrain_step, crosstrain_loss, ...), `extra` and `counts` as crosstrain_<key> (seconds for a
// `_s` suffix, `_total` for the running totals), per-rank `series` as crosstrain_<key>{rank="R"} and `labels` as
// crosstrain_info{key="value"} 1. Pure: the same metrics give the same text.
std::string prometheus_text(const StepMetrics& m);
// `now` with the values that only some steps carry (validation loss, straggler scores, ...) taken from `before`
// where `now` lacks them, so that a gauge keeps its last known value between the steps that measure it.
StepMetrics with_last_known(StepMetrics now, const StepMetrics& before);

class MetricsServer {
 public:
  // Listens on host:port (0: any free port) and serves GET /metrics from a background thread; other paths get 404.
  // Throws UsageError naming host:port when it cannot listen there (the port is in use, the host is not local).
  MetricsServer(const std::string& host, int port);
  // Stops listening and joins the thread (within about a second, even with a client connected).
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  // http://host:port/metrics
  std::string url() const;
  // Serves `m` from now on (with the values of earlier steps that `m` lacks; see with_last_known).
  void publish(const StepMetrics& m);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The server a run's rank 0 starts for `config`: none when obs.metrics_port is 0; else one on metrics_host:port,
// announced as "metrics: http://HOST:PORT/metrics" on stdout unless `quiet`.
std::unique_ptr<MetricsServer> start_metrics_server(const ObsConfig& config, bool quiet);

}  // namespace crosstrain::obs
