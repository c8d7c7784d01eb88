// The service layer of the compute network (ITU-T Y.2501): an HTTP/JSON API over the scheduler, and the loop that
// drives it. One mutex guards the scheduler: requests and the periodic tick take turns.
//
//   GET    /api/health               {"ok": true, "jobs": N, "queued": N}
//   GET    /                         the dashboard (dashboard.h)
//   GET    /api/clusters             {"clusters": [devices, free, up, price, power], "links": [a, b, bandwidth, latency]}
//   GET    /api/jobs                 every job: id, name, state, ranks, attempts, step, reason, placement
//   GET    /api/jobs/ID              one job
//   GET    /api/jobs/ID/events       its events (submitted, placed, started, re-placed, ...), oldest first
//   POST   /api/jobs                 a job spec (JSON, state_store.h) -> {"id": N, "state": ...}; 400 with the reason
//   DELETE /api/jobs/ID              cancel
//   GET    /api/jobs/ID/metrics      its run folder's metrics.jsonl rows (step, loss, tokens_per_s, mfu, ...), oldest
//                                    first, the newest 1000 at most; ?since=STEP: only rows past STEP (the dashboard
//                                    polls with the last step it has). [] for a job with no run folder (simulated)
//                                    or no step trained yet; a torn last line (the trainer mid-write) is left out.
//   GET    /api/jobs/ID/report       the run report (`crosstrain report`) of its run folder, HTML, rendered by
//                                    ServiceOptions::report_html; 404 naming why when there is no run folder, no
//                                    metrics yet or no renderer.
//   GET    /chart.js                 Chart.js from Debian's libjs-chart.js, for the dashboard's charts (no network)
//   POST   /api/clusters             a cluster registers: a cluster file holding it alone (TOML) -> {"result":
//                                    "added" (201), "up" (a lost cluster is back) or "unchanged"}; 400 for another
//                                    spec under a known name
//   POST   /api/links                a measured link {"a", "b", "bandwidth_gbps", "latency_us"}
// Errors are JSON too: {"error": "..."} with 400 (bad request), 401 (who are you), 403 (not allowed), 404 (no such
// job) or 500.
//
// Who may call (api_auth.h), when ServiceOptions::tokens is set (the daemon always sets it): every /api request
// needs a bearer token (GET: read or admin; POST and DELETE: admin), except registrations and link reports, which
// must be signed by the cluster they concern (the registered cluster; one end of the link). The dashboard page and
// /chart.js hold no data and need none; the page sends the token it was opened with (#token=...). A token may also
// come as ?access_token= on a GET (a report opened in a new tab). With tls_cert and tls_key it serves HTTPS.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "crosstrain/scheduler/api_auth.h"
#include "crosstrain/scheduler/observed_executor.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/state_store.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace crosstrain::scheduler {

// What a ledger holds, per computation (its ledger job name, train_share.h's ledger_job) and cluster: the totals of
// the verified entries. `message`: the verification's verdict ("ok: N entries", or the first bad line).
struct LedgerClaim {
  std::string job, cluster;
  int64_t steps = 0, tokens = 0;
  double flops = 0;
};
struct LedgerClaims {
  bool verified = true;
  std::string message;
  std::vector<LedgerClaim> claims;
};

// What appending a cluster's sealed ledger entry came to: 201 appended, 409 the chain moved on (read it again and
// seal after its new head), 400 refused; with a message for the cluster.
struct LedgerAppend {
  int status = 201;
  std::string message;
};

struct ServiceOptions {
  // The HTML report of a run folder. The apps pass obs's report (this layer cannot reach obs); empty: the report
  // endpoint answers 404 saying so.
  std::function<std::string(const std::string& run_dir)> report_html;
  // Served at /chart.js; where Debian's libjs-chart.js puts it (the dashboard shows figures without charts if absent).
  std::string chart_js_path = "/usr/share/javascript/chart.js/chart.min.js";
  // Bearer tokens and their roles; null: the API is open (tests and embedding only: the daemon always has tokens).
  std::shared_ptr<const ApiTokens> tokens;
  // The clusters' public keys: a registration or link report must carry the signature of the cluster it concerns.
  ClusterKeys cluster_keys;
  // HTTPS (PEM files) when both are given.
  std::string tls_cert, tls_key;
  // The ledger's verified claims (the apps read and verify it: this layer cannot reach the ledger), joined to the
  // jobs' users in GET /api/usage: what each user's jobs trained on each cluster, as the clusters signed it. Empty:
  // the usage holds device-hours only.
  std::function<LedgerClaims()> ledger_claims;
  // The ledger this scheduler keeps, for clusters that do not share its disk (`crosstrain ledger claim URL`): GET
  // /api/ledger answers its text (JSONL; whoever holds the keys verifies it), POST /api/ledger appends one entry a
  // cluster sealed after that text's head and signed. With tokens, a cluster signs both requests (or a token reads).
  // Empty: 404.
  std::function<std::string()> ledger_text;
  std::function<LedgerAppend(const std::string& line)> ledger_append;
  // The scheduler's executor, when it is an ObservedExecutor: the ticker observes the running jobs through it
  // before each tick, without the scheduler's lock (the API answers meanwhile). Null: the tick asks the executor
  // itself, under the lock (fast executors: the simulation, local processes).
  ObservedExecutor* observed = nullptr;
};

class SchedulerService {
 public:
  // Serves on host:port (port 0: any free one, see port()) and ticks the scheduler every `tick_every`.
  SchedulerService(Scheduler& scheduler, StateStore& store, const std::string& host, int port,
                   std::chrono::milliseconds tick_every, ServiceOptions options = {});
  ~SchedulerService();
  SchedulerService(const SchedulerService&) = delete;
  SchedulerService& operator=(const SchedulerService&) = delete;

  int port() const { return port_; }
  // Stops serving and ticking (the destructor does it too).
  void stop();
  // Blocks until stop() (from a signal handler's thread, or another thread).
  void wait();

 private:
  void routes();
  void run_routes();       // a job's run folder: metrics and report
  void resource_routes();  // clusters registering, measured links
  void ledger_routes();    // the ledger, read and appended to by clusters
  void tick_loop();
  // Refuses (answers 401 or 403) a request its caller may not make; true when it answered.
  bool refused(const httplib::Request& req, httplib::Response& res) const;
  // The cluster that signed a registration or link report; throws AuthError when the signature is missing or bad.
  std::string signer(const httplib::Request& req);

  Scheduler& scheduler_;
  StateStore& store_;
  ServiceOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::unique_ptr<RequestVerifier> verifier_;
  std::mutex mutex_;  // the scheduler and the store
  std::chrono::milliseconds tick_every_;
  int port_ = 0;
  bool stopping_ = false;
  std::mutex stop_mutex_;
  std::condition_variable stopped_;
  std::thread http_, ticker_;
};

// JSON of a job as the API returns it.
std::string job_to_json(const JobRecord& job);

// The rows of the metrics.jsonl at `path` with a step past `since` (all when since < 0), oldest first, the newest
// `limit` of them, as a JSON array; lines that do not parse (a torn last line) are left out, a missing file is [].
// Reads from the end of the file: steps only grow in it (a resumed run truncates what came after its checkpoint).
std::string metrics_rows_json(const std::string& path, int64_t since, size_t limit);

}  // namespace crosstrain::scheduler
