#include "crosstrain/scheduler/service.h"
#include "crosstrain/scheduler/train_share.h"

#include <httplib.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <nlohmann/json.hpp>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/scheduler/dashboard.h"

namespace crosstrain::scheduler {
namespace {

using nlohmann::json;

constexpr size_t kMaxBodyBytes = 1 << 20;

json placement_json(const PlacementRecord& p) {
  json shares = json::array();
  for (const auto& s : p.shares)
    shares.push_back({{"cluster", s.cluster}, {"ranks", s.ranks}, {"layout", s.layout}, {"absent", s.absent}});
  return {{"shares", shares},     {"layout", p.layout},     {"sync", planner::to_string(p.sync)},
          {"inner_steps", p.inner_steps}, {"step_s", p.step_s}, {"wan_gbps", p.wan_gbps},
          {"cost", p.cost},         {"attempt", p.attempt}};
}

json job_json(const JobRecord& j) {
  json out = {{"id", j.id},
              {"name", j.spec.name},
              {"user", j.spec.user},
              {"priority", j.spec.priority},
              {"state", to_string(j.state)},
              {"ranks", j.spec.ranks},
              {"steps", j.spec.steps},
              {"attempts", j.attempts},
              {"restarts", j.restarts},
              {"step", j.step},
              {"reason", j.reason},
              {"submitted_s", j.submitted_s},
              {"updated_s", j.updated_s},
              {"spec", json::parse(job_spec_to_json(j.spec))}};
  // The recipe's text stays with the scheduler (up to 256 KiB a job, and the submitter's): its size is shown.
  if (out["spec"].contains("recipe_text")) {
    out["spec"]["recipe_bytes"] = j.spec.recipe_text.size();
    out["spec"].erase("recipe_text");
  }
  out["placement"] = j.placement ? placement_json(*j.placement) : json(nullptr);
  return out;
}

// A request its caller may not make: 401 (no or wrong credentials) or 403 (a role too small).
struct AuthError : std::runtime_error {
  AuthError(int status_, const std::string& why) : std::runtime_error(why), status(status_) {}
  int status;
};

void reply(httplib::Response& res, int status, const json& body) {
  res.status = status;
  // An error may quote a client's bytes that are not UTF-8 (a parser's message about them): replaced, not thrown.
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// The job id of the path; an id of more digits than an int64 holds names no job (404), it is not a server error.
int64_t id_of(const httplib::Request& req) {
  const std::string digits = req.matches[1];
  if (digits.size() > 18) throw UsageError("no job " + digits.substr(0, 24) + (digits.size() > 24 ? "..." : ""));
  return std::stoll(digits);
}

// Runs a handler, turning its exceptions into JSON errors: "no job N" is 404, other usage errors 400.
template <typename Handler>
void answer(const httplib::Request& req, httplib::Response& res, const Handler& handler) {
  try {
    handler(req, res);
  } catch (const UsageError& e) {
    reply(res, std::string(e.what()).rfind("no job ", 0) == 0 ? 404 : 400, {{"error", e.what()}});
  } catch (const AuthError& e) {
    reply(res, e.status, {{"error", e.what()}});
  } catch (const std::exception& e) {
    reply(res, 500, {{"error", e.what()}});
  }
}

// The newest rows a metrics request may return (about 1 MB of the trainer's rows): enough for the dashboard's charts.
constexpr size_t kMetricsRows = 1000;

int64_t since_of(const httplib::Request& req) {
  if (!req.has_param("since")) return -1;
  const std::string text = req.get_param_value("since");
  try {
    size_t used = 0;
    const int64_t since = std::stoll(text, &used);
    if (used == text.size()) return since;
  } catch (const std::exception&) {
  }
  throw UsageError("metrics: ?since=" + text + " is not a step number (give the last step you have, e.g. since=120)");
}

// The contents of a file, or "" when it cannot be read.
std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string job_to_json(const JobRecord& job) { return job_json(job).dump(); }

SchedulerService::SchedulerService(Scheduler& scheduler, StateStore& store, const std::string& host, int port,
                                   std::chrono::milliseconds tick_every, ServiceOptions options)
    : scheduler_(scheduler),
      store_(store),
      options_(std::move(options)),
      tick_every_(tick_every) {
  if (options_.tls_cert.empty() != options_.tls_key.empty())
    throw UsageError("scheduler: HTTPS needs both a certificate and its key (--tls-cert and --tls-key)");
  if (!options_.tls_cert.empty()) {
    auto tls = std::make_unique<httplib::SSLServer>(options_.tls_cert.c_str(), options_.tls_key.c_str());
    if (!tls->is_valid())
      throw UsageError("scheduler: cannot serve HTTPS with certificate '" + options_.tls_cert + "' and key '" +
                       options_.tls_key + "' (PEM files that belong together, e.g. from `openssl req -x509 -newkey "
                       "ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout key.pem -out cert.pem -subj /CN=HOST`)");
    server_ = std::move(tls);
  } else {
    server_ = std::make_unique<httplib::Server>();
  }
  verifier_ = std::make_unique<RequestVerifier>(options_.cluster_keys);
  server_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    return refused(req, res) ? httplib::Server::HandlerResponse::Handled : httplib::Server::HandlerResponse::Unhandled;
  });
  server_->new_task_queue = [] { return new httplib::ThreadPool(4); };
  server_->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  server_->set_keep_alive_max_count(1);
  server_->set_read_timeout(5, 0);
  server_->set_write_timeout(5, 0);
  // A job spec or a cluster registration is a few kilobytes: a body of any size was read into memory.
  server_->set_payload_max_length(kMaxBodyBytes);
  routes();
  run_routes();
  resource_routes();
  ledger_routes();
  errno = 0;
  port_ = port == 0 ? server_->bind_to_any_port(host) : (server_->bind_to_port(host, port) ? port : -1);
  if (port_ <= 0)
    throw UsageError("scheduler: cannot listen on " + host + ":" + std::to_string(port) +
                     (errno ? std::string(": ") + std::strerror(errno) : "") + "; choose another --port");
  http_ = std::thread([this] { server_->listen_after_bind(); });
  ticker_ = std::thread([this] { tick_loop(); });
}

SchedulerService::~SchedulerService() { stop(); }

bool SchedulerService::refused(const httplib::Request& req, httplib::Response& res) const {
  if (!options_.tokens || req.path.rfind("/api/", 0) != 0) return false;  // the page and Chart.js hold no data
  // Clusters sign their registrations and link reports instead (checked in the handler, against the body).
  if (req.method == "POST" && (req.path == "/api/clusters" || req.path == "/api/links")) return false;
  // A cluster reads and appends to the ledger with its signature; a person reads it with a token.
  if (req.path == "/api/ledger" && (req.method == "POST" || req.has_header(kSignatureHeader))) return false;
  std::string authorization = req.get_header_value("Authorization");
  if (authorization.empty() && req.method == "GET" && req.has_param("access_token"))
    authorization = "Bearer " + req.get_param_value("access_token");
  const ApiRole role = options_.tokens->role_of(authorization);
  const ApiRole need = req.method == "GET" ? ApiRole::Read : ApiRole::Admin;
  if (static_cast<int>(role) >= static_cast<int>(need)) return false;
  if (role == ApiRole::None) {
    res.set_header("WWW-Authenticate", "Bearer");
    reply(res, 401, {{"error", std::string(authorization.empty() ? "this API needs a token" : "unknown token") +
                                   ": send `Authorization: Bearer TOKEN` (crosstrain job --token-file FILE; the "
                                   "daemon's tokens file is beside its --state)"}});
  } else {
    reply(res, 403, {{"error", std::string("a ") + to_string(role) + " token cannot " + req.method + " " + req.path +
                                   ": it needs an admin token"}});
  }
  return true;
}

std::string SchedulerService::signer(const httplib::Request& req) {
  if (!options_.tokens) return "";
  if (!verifier_->knows_clusters())
    throw AuthError(403, "this scheduler holds no cluster keys, so no cluster can register or report links: start "
                         "it with --cluster-keys KEYS.json (crosstrain ledger keygen writes one)");
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const SignedBy by = verifier_->verify(req.get_header_value(kSignatureHeader), req.method, req.path, req.body, now);
  if (!by.error.empty()) throw AuthError(401, by.error);
  return by.cluster;
}

void SchedulerService::stop() {
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopping_ && !http_.joinable()) return;
    stopping_ = true;
  }
  stopped_.notify_all();
  server_->stop();
  if (http_.joinable()) http_.join();
  if (ticker_.joinable()) ticker_.join();
}

void SchedulerService::wait() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  stopped_.wait(lock, [this] { return stopping_; });
}

void SchedulerService::tick_loop() {
  std::unique_lock<std::mutex> lock(stop_mutex_);
  while (!stopping_) {
    lock.unlock();
    int64_t epoch = 0;
    if (options_.observed) {
      std::vector<int64_t> running;
      {
        std::lock_guard<std::mutex> guard(mutex_);
        running = scheduler_.running();
        epoch = scheduler_.up_epoch();
      }
      try {
        options_.observed->observe(running);  // the slow part (squeue, scontrol ping): the API answers meanwhile
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> guard(mutex_);
        store_.add_event(0, 0, "observe-failed", e.what());
      }
    }
    {
      std::lock_guard<std::mutex> guard(mutex_);
      // A cluster registered again while it was being asked about: what was seen of it is from before.
      if (options_.observed && scheduler_.up_epoch() != epoch) options_.observed->forget_lost();
      try {
        scheduler_.tick();
      } catch (const std::exception& e) {
        store_.add_event(0, 0, "tick-failed", e.what());  // kept for the operator; the loop goes on
      }
    }
    lock.lock();
    stopped_.wait_for(lock, tick_every_, [this] { return stopping_; });
  }
}

void SchedulerService::routes() {
  auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mutex_);
      answer(req, res, handler);
    };
  };
  server_->Get("/api/health", guarded([this](const httplib::Request&, httplib::Response& res) {
    reply(res, 200, {{"ok", true}, {"jobs", scheduler_.jobs().size()}, {"queued", scheduler_.queued()}});
  }));
  server_->Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dashboard_html(), "text/html; charset=utf-8");
  });
  server_->Get("/api/clusters", guarded([this](const httplib::Request&, httplib::Response& res) {
    const Registry& r = scheduler_.registry();
    json clusters = json::array(), links = json::array();
    for (const auto& c : r.clusters())
      clusters.push_back({{"name", c.name}, {"device", c.device}, {"devices", c.devices}, {"free", c.free},
                          {"up", c.up}, {"price_per_device_hour", c.price_per_device_hour}, {"power_w", c.power_w},
                          {"peak_flops", c.peak_flops}});
    const auto all = r.clusters();
    for (size_t a = 0; a < all.size(); ++a)
      for (size_t b = a + 1; b < all.size(); ++b) {
        const auto& l = r.link(all[a].name, all[b].name);
        links.push_back({{"a", all[a].name}, {"b", all[b].name}, {"bandwidth_Bps", l.bandwidth_Bps},
                         {"latency_s", l.latency_s}});
      }
    reply(res, 200, {{"clusters", clusters}, {"links", links}});
  }));
  server_->Get("/api/jobs", guarded([this](const httplib::Request&, httplib::Response& res) {
    json out = json::array();
    for (const JobRecord* j : scheduler_.jobs()) out.push_back(job_json(*j));
    reply(res, 200, out);
  }));
  server_->Get(R"(/api/jobs/(\d+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
    reply(res, 200, job_json(scheduler_.job(id_of(req))));
  }));
  // Device-hours from the scheduler's own accounting; with a ledger, the steps, tokens and FLOPs each cluster
  // signed for each user's jobs (read and verified outside the lock: a long ledger takes a while).
  server_->Get("/api/usage", [this](const httplib::Request& req, httplib::Response& res) {
    answer(req, res, [&](const httplib::Request&, httplib::Response&) {
      const LedgerClaims ledger = options_.ledger_claims ? options_.ledger_claims() : LedgerClaims{};
      std::lock_guard<std::mutex> lock(mutex_);
      std::map<std::pair<std::string, std::string>, json> rows;  // (user, cluster)
      auto row = [&](const std::string& user, const std::string& cluster) -> json& {
        json& r = rows[{user, cluster}];
        if (r.is_null())
          r = {{"user", user}, {"cluster", cluster}, {"device_hours", 0.0}, {"steps", 0}, {"tokens", 0}, {"flops", 0.0}};
        return r;
      };
      for (const auto& u : scheduler_.usage()) row(u.user, u.cluster)["device_hours"] = u.device_s / 3600.0;
      for (const LedgerClaim& c : ledger.claims) {
        const int64_t id = job_of_ledger_job(c.job);
        const bool ours = id > 0 && scheduler_.has_job(id);
        json& r = row(ours ? scheduler_.job(id).spec.user : "(not a job of this scheduler)", c.cluster);
        r["steps"] = r["steps"].get<int64_t>() + c.steps;
        r["tokens"] = r["tokens"].get<int64_t>() + c.tokens;
        r["flops"] = r["flops"].get<double>() + c.flops;
      }
      json out = json::array();
      for (auto& [key, r] : rows) {
        if (options_.ledger_claims) r["ledger"] = ledger.verified ? "verified" : "refused: " + ledger.message;
        out.push_back(std::move(r));
      }
      reply(res, 200, out);
    });
  });
  server_->Get(R"(/api/jobs/(\d+)/events)", guarded([this](const httplib::Request& req, httplib::Response& res) {
    scheduler_.job(id_of(req));  // 404 for an unknown job
    json out = json::array();
    for (const auto& e : store_.events(id_of(req)))
      out.push_back({{"time_s", e.time_s}, {"kind", e.kind}, {"detail", e.detail}});
    reply(res, 200, out);
  }));
  server_->Post("/api/jobs", guarded([this](const httplib::Request& req, httplib::Response& res) {
    const int64_t id = scheduler_.submit(job_spec_from_json(req.body));
    const JobRecord& j = scheduler_.job(id);
    // A job that can never run is recorded too (failed, with the reason): the client decides how to report it.
    reply(res, 201, {{"id", id}, {"state", to_string(j.state)}, {"reason", j.reason}});
  }));
  server_->Delete(R"(/api/jobs/(\d+))", guarded([this](const httplib::Request& req, httplib::Response& res) {
    const bool cancelled = scheduler_.cancel(id_of(req));
    reply(res, 200, {{"id", id_of(req)}, {"cancelled", cancelled}, {"state", to_string(scheduler_.job(id_of(req)).state)}});
  }));
}

// The resource layer's registration: clusters announce themselves (a planner cluster file holding one cluster, as
// TOML) and measured links between them.
void SchedulerService::resource_routes() {
  auto guarded = [this](auto handler) {
    return [this, handler](const httplib::Request& req, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mutex_);
      answer(req, res, handler);
    };
  };
  server_->Post("/api/clusters", guarded([this](const httplib::Request& req, httplib::Response& res) {
    const std::string by = signer(req);
    const planner::ClusterFile one = planner::parse_cluster(req.body, "the registration");
    if (!by.empty() && one.clusters.at(0).name != by)
      throw AuthError(403, "cluster '" + by + "' signed the registration of cluster '" + one.clusters.at(0).name +
                               "': a cluster registers only itself");
    const std::string what = scheduler_.register_cluster(one);
    reply(res, what == "added" ? 201 : 200, {{"cluster", one.clusters.at(0).name}, {"result", what}});
  }));
  server_->Post("/api/links", guarded([this](const httplib::Request& req, httplib::Response& res) {
    const std::string by = signer(req);
    if (const std::string deep = json_nesting_error(req.body, kMaxJsonDepth); !deep.empty())
      throw UsageError("a link: " + deep);
    const json j = json::parse(req.body, nullptr, false);
    if (!j.is_object() || !j.contains("a") || !j.contains("b") || !j.contains("bandwidth_gbps") ||
        !j["bandwidth_gbps"].is_number() || j["bandwidth_gbps"].get<double>() <= 0)
      throw UsageError("a link is {\"a\": CLUSTER, \"b\": CLUSTER, \"bandwidth_gbps\": > 0, \"latency_us\": >= 0}");
    if (!by.empty() && j["a"] != by && j["b"] != by)
      throw AuthError(403, "cluster '" + by + "' reported a link it is not an end of: a cluster reports its own links");
    comm::Link link;
    link.bandwidth_Bps = j["bandwidth_gbps"].get<double>() * 1e9 / 8;
    link.latency_s = j.value("latency_us", 0.0) * 1e-6;
    scheduler_.set_link(j["a"].get<std::string>(), j["b"].get<std::string>(), link);
    reply(res, 200, {{"a", j["a"]}, {"b", j["b"]}, {"bandwidth_Bps", link.bandwidth_Bps}, {"latency_s", link.latency_s}});
  }));
}

// A job's run folder is read without the scheduler's lock (a report of a long run takes a while): only finding the
// folder takes it.
void SchedulerService::run_routes() {
  auto run_dir = [this](const httplib::Request& req) {
    std::lock_guard<std::mutex> lock(mutex_);
    scheduler_.job(id_of(req));  // "no job N": 404
    return scheduler_.executor().run_dir(id_of(req));
  };
  server_->Get(R"(/api/jobs/(\d+)/metrics)", [run_dir](const httplib::Request& req, httplib::Response& res) {
    answer(req, res, [&](const httplib::Request&, httplib::Response&) {
      const int64_t since = since_of(req);
      const std::string dir = run_dir(req);
      res.status = 200;
      res.set_content(dir.empty() ? "[]" : metrics_rows_json(dir + "/metrics.jsonl", since, kMetricsRows),
                      "application/json");
    });
  });
  server_->Get(R"(/api/jobs/(\d+)/report)", [this, run_dir](const httplib::Request& req, httplib::Response& res) {
    answer(req, res, [&](const httplib::Request&, httplib::Response&) {
      const std::string job = "job " + std::to_string(id_of(req));
      const std::string dir = run_dir(req);
      if (dir.empty())
        return reply(res, 404, {{"error", job + " has no run folder (a simulated job, or no recipe): no report"}});
      const std::string metrics = dir + "/metrics.jsonl";
      std::error_code ec;
      if (std::filesystem::file_size(metrics, ec) == 0 || ec)
        return reply(res, 404, {{"error", job + " has no metrics yet (" + metrics +
                                              " is missing or empty): the report comes once it has trained a step"}});
      if (!options_.report_html)
        return reply(res, 404, {{"error", "this scheduler renders no reports (started without a report renderer); "
                                          "run `crosstrain report " + dir + "`"}});
      res.status = 200;
      res.set_content(options_.report_html(dir), "text/html; charset=utf-8");
    });
  });
  server_->Get("/chart.js", [this](const httplib::Request&, httplib::Response& res) {
    const std::string chart_js = read_file(options_.chart_js_path);  // 200 KB, once per page load
    if (chart_js.empty())
      return reply(res, 404, {{"error", "no Chart.js at '" + options_.chart_js_path +
                                            "': apt-get install libjs-chart.js (the dashboard shows figures only)"}});
    res.set_content(chart_js, "application/javascript");
  });
}

// Not under the scheduler's lock: the ledger has its own (an flock), and reading it may take a while.
void SchedulerService::ledger_routes() {
  server_->Get("/api/ledger", [this](const httplib::Request& req, httplib::Response& res) {
    answer(req, res, [this](const httplib::Request& req, httplib::Response& res) {
      if (req.has_header(kSignatureHeader)) signer(req);
      if (!options_.ledger_text) throw AuthError(404, "this scheduler keeps no ledger (start it with --ledger FILE)");
      res.status = 200;
      res.set_content(options_.ledger_text(), "application/jsonl");
    });
  });
  server_->Post("/api/ledger", [this](const httplib::Request& req, httplib::Response& res) {
    answer(req, res, [this](const httplib::Request& req, httplib::Response& res) {
      const std::string by = signer(req);
      if (!options_.ledger_append) throw AuthError(404, "this scheduler keeps no ledger (start it with --ledger FILE)");
      if (const std::string deep = json_nesting_error(req.body, kMaxJsonDepth); !deep.empty())
        throw UsageError("a ledger entry: " + deep);
      const json entry = json::parse(req.body, nullptr, false);
      if (!entry.is_object() || !entry.contains("cluster") || !entry["cluster"].is_string())
        throw UsageError("a ledger entry is one JSON line of crosstrain ledger's (with \"cluster\")");
      if (!by.empty() && entry["cluster"] != by)
        throw AuthError(403, "cluster '" + by + "' sent an entry of cluster '" + entry["cluster"].get<std::string>() +
                                 "': a cluster appends only its own");
      const LedgerAppend done = options_.ledger_append(req.body);
      reply(res, done.status, done.status < 300 ? json{{"result", done.message}} : json{{"error", done.message}});
    });
  });
}

}  // namespace crosstrain::scheduler
