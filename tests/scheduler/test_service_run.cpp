// Each job's live metrics and report through the scheduler's service (service.h), with an executor whose jobs
// have run folders the test writes: GET /api/jobs/ID/metrics (the tail of metrics.jsonl, a torn last line left
// out, ?since=), GET /api/jobs/ID/report (through the renderer the apps pass in, 404s naming why), /chart.js, and
// the dashboard rendered in headless Chromium with a job selected: its figures and charts drawn. No training.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <nlohmann/json.hpp>
#include <sodium.h>

#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/service.h"
#include "chromium.h"
#include "scheduler_test_util.h"
#include "subprocess.h"
#include "scratch.h"

namespace crosstrain::scheduler {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using crosstrain::testing::contains;

// Jobs run forever; those in `dirs` have that run folder (filled before the service starts: it reads it from its
// own threads).
class FolderExecutor : public Executor {
 public:
  void start(const JobRecord&, const PlacementRecord&) override {}
  void stop(int64_t) override {}
  ExecStatus status(int64_t) override { return {ExecStatus::Running, 0, 0, ""}; }
  std::vector<std::string> lost_clusters() override { return {}; }
  std::string run_dir(int64_t id) const override {
    const auto it = dirs.find(id);
    return it == dirs.end() ? "" : it->second;
  }
  std::map<int64_t, std::string> dirs;
};

JobSpec spec(const std::string& name) {
  JobSpec j;
  j.name = name;
  j.model = planner::model_preset("gpt2");
  j.ranks = 8;
  j.steps = 1000;
  return j;
}

std::string row(int64_t step, double loss) {
  return json{{"step", step}, {"loss", loss}, {"lr", 3e-4}, {"tokens_per_s", 1000.0 * step}, {"mfu", 0.01 * step},
              {"step_time_s", 0.5}}
      .dump();
}

// Three whole rows and a fourth the trainer is still writing.
void write_metrics(const fs::path& dir) {
  fs::create_directories(dir);
  std::ofstream(dir / "metrics.jsonl") << row(1, 3.5) << "\n" << row(2, 3.0) << "\n" << row(3, 2.5) << "\n"
                                       << "{\"step\":4,\"lo";
}

// A fresh folder for each rig (two may live at once).
fs::path fresh_dir() {
  static int rigs = 0;
  return crosstrain::testing::scratch_dir("service-run-" + std::to_string(++rigs));
}

// Job 1: simulated (no run folder); job 2: trains, three steps in its metrics; job 3: its folder has no metrics yet.
struct Rig {
  explicit Rig(ServiceOptions options = {})
      : dir(fresh_dir()), store((dir / "state.db").string()), sched(testing::two_clusters(10), store, exec) {
    write_metrics(dir / "job-2");
    fs::create_directories(dir / "job-3");
    exec.dirs = {{2, (dir / "job-2").string()}, {3, (dir / "job-3").string()}};
    for (const char* name : {"simulated", "trains", "starting"}) sched.submit(spec(name));
    sched.tick();
    service = std::make_unique<SchedulerService>(sched, store, "127.0.0.1", 0, std::chrono::milliseconds(200),
                                                 std::move(options));
  }
  ~Rig() {
    service.reset();
    fs::remove_all(dir);
  }
  httplib::Result get(const std::string& path) {
    httplib::Client client("127.0.0.1", service->port());
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    return client.Get(path);
  }
  json get_json(const std::string& path, int status) {
    const auto r = get(path);
    if (!r) return json{{"no answer", httplib::to_string(r.error())}};
    EXPECT_EQ(r->status, status) << path << ": " << r->body;
    return json::parse(r->body);
  }
  fs::path dir;
  FolderExecutor exec;
  StateStore store;
  Scheduler sched;
  std::unique_ptr<SchedulerService> service;
};

ServiceOptions with_reports() {
  ServiceOptions o;
  o.report_html = [](const std::string& run_dir) { return "<html><body>report of " + run_dir + "</body></html>"; };
  return o;
}

TEST(SchedulerServiceRun, MetricsAreTheRunFoldersRowsWithoutTheTornLastLine) {
  Rig rig;
  const json rows = rig.get_json("/api/jobs/2/metrics", 200);
  ASSERT_EQ(rows.size(), 3u) << rows.dump();
  EXPECT_EQ(rows[0]["step"], 1);
  EXPECT_EQ(rows[2]["step"], 3);
  EXPECT_DOUBLE_EQ(rows[2]["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(rows[2]["tokens_per_s"].get<double>(), 3000);
  const json later = rig.get_json("/api/jobs/2/metrics?since=2", 200);
  ASSERT_EQ(later.size(), 1u) << later.dump();
  EXPECT_EQ(later[0]["step"], 3);
  EXPECT_EQ(rig.get_json("/api/jobs/2/metrics?since=3", 200), json::array());
  // The trainer finishes the line: the row appears.
  std::ofstream(rig.dir / "job-2" / "metrics.jsonl", std::ios::app) << "ss\":2.25}\n";
  EXPECT_EQ(rig.get_json("/api/jobs/2/metrics?since=3", 200), json::parse(R"([{"step":4,"loss":2.25}])"));
}

TEST(SchedulerServiceRun, MetricsAreEmptyWithoutARunFolderOrRowsAnd404ForAnUnknownJob) {
  Rig rig;
  EXPECT_EQ(rig.get_json("/api/jobs/1/metrics", 200), json::array());  // simulated: no run folder
  EXPECT_EQ(rig.get_json("/api/jobs/3/metrics", 200), json::array());  // no metrics.jsonl yet
  EXPECT_TRUE(contains(rig.get_json("/api/jobs/99/metrics", 404).value("error", ""), "no job 99"));
  EXPECT_TRUE(contains(rig.get_json("/api/jobs/2/metrics?since=abc", 400).value("error", ""), "since=abc"));
}

TEST(SchedulerServiceRun, MetricsOfALongRunAreItsNewest1000Rows) {
  const fs::path path = fs::path(::testing::TempDir()) / ("ct-service-long-" + std::to_string(::getpid()) + ".jsonl");
  {
    std::ofstream out(path);
    for (int step = 1; step <= 2500; ++step) out << row(step, 1.0 / step) << "\n";  // ~250 KB: several 64 KB reads
  }
  const json rows = json::parse(metrics_rows_json(path.string(), -1, 1000));
  ASSERT_EQ(rows.size(), 1000u);
  EXPECT_EQ(rows.front()["step"], 1501);
  EXPECT_EQ(rows.back()["step"], 2500);
  EXPECT_EQ(json::parse(metrics_rows_json(path.string(), 2490, 1000)).size(), 10u);
  EXPECT_EQ(json::parse(metrics_rows_json(path.string(), -1, 3)).front()["step"], 2498);
  EXPECT_EQ(metrics_rows_json((path.string() + ".missing"), -1, 1000), "[]");
  fs::remove(path);
}

TEST(SchedulerServiceRun, TheReportIsTheRenderersPageOfTheRunFolder) {
  Rig rig(with_reports());
  const auto r = rig.get("/api/jobs/2/report");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(contains(r->get_header_value("Content-Type"), "text/html"));
  EXPECT_EQ(r->body, "<html><body>report of " + (rig.dir / "job-2").string() + "</body></html>");
  EXPECT_TRUE(contains(rig.get_json("/api/jobs/1/report", 404).value("error", ""), "no run folder"));
  EXPECT_TRUE(contains(rig.get_json("/api/jobs/3/report", 404).value("error", ""), "no metrics yet"));
  EXPECT_TRUE(contains(rig.get_json("/api/jobs/99/report", 404).value("error", ""), "no job 99"));
}

TEST(SchedulerServiceRun, WithoutARendererTheReportIs404SayingSo) {
  Rig rig;
  const std::string error = rig.get_json("/api/jobs/2/report", 404).value("error", "");
  EXPECT_TRUE(contains(error, "renders no reports")) << error;
  EXPECT_TRUE(contains(error, "crosstrain report " + (rig.dir / "job-2").string())) << error;
}

TEST(SchedulerServiceRun, ChartJsIsServedFromDebiansPackageOr404NamingIt) {
  ServiceOptions missing;
  missing.chart_js_path = "/nonexistent/chart.min.js";
  Rig rig(missing);
  EXPECT_TRUE(contains(rig.get_json("/chart.js", 404).value("error", ""), "libjs-chart.js"));
  Rig served;
  if (!fs::exists(ServiceOptions().chart_js_path)) GTEST_SKIP() << "libjs-chart.js is absent";
  const auto r = served.get("/chart.js");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(contains(r->body, "Chart")) << r->body.substr(0, 200);
}

// ---- the dashboard in a browser ---------------------------------------------------------------------------------

using crosstrain::testing::chromium_dom;

TEST(SchedulerServiceRun, TheDashboardShowsTheSelectedJobsLiveMetricsInABrowser) {
  if (!fs::exists("/usr/bin/chromium")) GTEST_SKIP() << "chromium is absent (scripts/install-deps.sh installs it)";
  if (!fs::exists(ServiceOptions().chart_js_path)) GTEST_SKIP() << "libjs-chart.js is absent";
  Rig rig(with_reports());
  const std::string base = "http://127.0.0.1:" + std::to_string(rig.service->port()) + "/";
  const std::string dom = chromium_dom(base + "#job=2", rig.dir / "browser");
  EXPECT_TRUE(contains(dom, "data-status=\"ok\"")) << dom.substr(0, 3000);
  for (const char* text : {"data-rows=\"3\"", "data-chart=\"drawn\"", "<b id=\"m-step\">3</b>", "<b id=\"m-loss\">2.5000</b>",
                           "<b id=\"m-tps\">3,000</b>", "<b id=\"m-mfu\">3.0%</b>", "href=\"/api/jobs/2/report\"",
                           "2 (trains)", "<canvas id=\"chart-loss\""})
    EXPECT_TRUE(contains(dom, text)) << "the dashboard of job 2 lacks '" << text << "'";
  // Chart.js drew into the canvases (it sizes them and marks them as its own).
  EXPECT_TRUE(contains(dom, "<canvas id=\"chart-loss\" width=")) << "the loss chart was not drawn";
  // A simulated job: no figures, no charts, a note, and the page still works.
  const std::string simulated = chromium_dom(base + "#job=1", rig.dir / "browser-simulated");
  EXPECT_TRUE(contains(simulated, "data-status=\"ok\"")) << simulated.substr(0, 3000);
  EXPECT_TRUE(contains(simulated, "data-rows=\"0\""));
  EXPECT_TRUE(contains(simulated, "no metrics: a simulated job")) << "the note for a job without a run folder is missing";
  if (const char* keep = std::getenv("CT_DASHBOARD_METRICS_PNG")) {
    chromium_dom(base + "#job=2", rig.dir / "browser-shot", keep);
    EXPECT_GT(fs::exists(keep) ? fs::file_size(keep) : 0, 10000u) << "the screenshot is missing or empty";
  }
}

// What an attacker who reaches the API sent before (issue 34): a job whose model has heads = 0 (the placement
// divided by it and the daemon died of SIGFPE), a cluster whose name holds shell syntax (it went unquoted into the
// share script), a job name with a path in it, a body of 2 MiB. Each is refused with the reason, nothing is
// recorded, and the daemon answers on.
TEST(SchedulerServiceInput, HostileRequestsAreRefusedAndTheDaemonStaysUp) {
  Rig rig;
  auto post = [&](const std::string& path, const std::string& body, const std::string& type) {
    httplib::Client client("127.0.0.1", rig.service->port());
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    return client.Post(path, body, type);
  };
  const json no_heads = {{"name", "fpe"}, {"ranks", 2}, {"model", {{"layers", 2}, {"hidden", 64}, {"heads", 0}}}};
  auto r = post("/api/jobs", no_heads.dump(), "application/json");
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(contains(r->body, "heads")) << r->body;

  r = post("/api/jobs", json{{"name", "../../etc/x;id"}, {"ranks", 2}}.dump(), "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(contains(r->body, "is not a valid name")) << r->body;

  const std::string evil = "name = \"evil\"\n[[clusters]]\nname = \"x$(touch /tmp/ct-pwned)\"\nhosts = 1\n";
  r = post("/api/clusters", evil, "application/toml");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400) << r->body;
  EXPECT_TRUE(contains(r->body, "the name must be")) << r->body;

  r = post("/api/jobs", std::string(2 << 20, ' ') + "{}", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 413) << r->body.substr(0, 200);

  EXPECT_EQ(rig.get_json("/api/health", 200).is_object(), true);
  EXPECT_EQ(rig.get_json("/api/jobs", 200).size(), 3u);  // the rig's own jobs, none of the refused ones
  EXPECT_EQ(rig.get_json("/api/clusters", 200)["clusters"].size(), 2u);
}

}  // namespace
}  // namespace crosstrain::scheduler

namespace crosstrain::scheduler {
namespace {

constexpr const char* kAdmin = "admin-token-0123456789abcdef";
constexpr const char* kRead = "read-token-0123456789abcdef";

ServiceOptions guarded_options(const ClusterKeys& keys = {}) {
  ServiceOptions o;
  o.tokens = std::make_shared<ApiTokens>(
      ApiTokens::parse(std::string("admin ") + kAdmin + "\nread " + kRead + "\n", "test tokens"));
  o.cluster_keys = keys;
  return o;
}

httplib::Result call(int port, const std::string& method, const std::string& path, const std::string& token,
                     const std::string& body = "", httplib::Headers headers = {}) {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  if (!token.empty()) headers.emplace("Authorization", std::string("Bearer ") + token);
  if (method == "GET") return client.Get(path, headers);
  if (method == "DELETE") return client.Delete(path, headers);
  return client.Post(path, headers, body, "application/json");
}

int status_of(const httplib::Result& r) { return r ? r->status : -1; }

}  // namespace

// Every API call needs a token of the right role (issue 34): an anonymous caller sees nothing and changes nothing,
// a read token sees but cannot submit or cancel, an admin token does both; the page and Chart.js need none.
TEST(SchedulerServiceAuth, TokensDecideWhoSeesAndWhoChanges) {
  Rig rig(guarded_options());
  const int port = rig.service->port();
  const std::string job = json{{"name", "added"}, {"ranks", 2}}.dump();
  auto anonymous = call(port, "GET", "/api/jobs", "");
  ASSERT_TRUE(anonymous);
  EXPECT_EQ(anonymous->status, 401) << anonymous->body;
  EXPECT_TRUE(contains(anonymous->body, "Authorization: Bearer")) << anonymous->body;
  EXPECT_EQ(anonymous->get_header_value("WWW-Authenticate"), "Bearer");
  EXPECT_EQ(status_of(call(port, "GET", "/api/jobs", "guessed-token-0123456789")), 401);
  EXPECT_EQ(status_of(call(port, "POST", "/api/jobs", "", job)), 401);
  EXPECT_EQ(status_of(call(port, "DELETE", "/api/jobs/1", "")), 401);
  EXPECT_EQ(status_of(call(port, "GET", "/api/jobs/2/metrics", "")), 401) << "a run's metrics are data too";
  EXPECT_EQ(status_of(call(port, "GET", "/api/jobs", kRead)), 200);
  EXPECT_EQ(status_of(call(port, "GET", "/api/jobs/2/report?access_token=" + std::string(kRead), "")), 404)
      << "a read token in the query reaches the report (no renderer here: 404 naming why, not 401)";
  auto read_submit = call(port, "POST", "/api/jobs", kRead, job);
  EXPECT_EQ(status_of(read_submit), 403);
  EXPECT_EQ(status_of(call(port, "DELETE", "/api/jobs/1", kRead)), 403);
  EXPECT_EQ(status_of(call(port, "POST", "/api/jobs?access_token=" + std::string(kAdmin), "", job)), 401)
      << "a token in the query is only for reading";
  EXPECT_EQ(status_of(call(port, "GET", "/", "")), 200) << "the page holds no data";
  EXPECT_NE(status_of(call(port, "GET", "/chart.js", "")), 401);
  EXPECT_EQ(status_of(call(port, "POST", "/api/jobs", kAdmin, job)), 201);
  EXPECT_EQ(status_of(call(port, "DELETE", "/api/jobs/1", kAdmin)), 200);
  // Only the admin's job was added: three from the rig, one now.
  auto all = call(port, "GET", "/api/jobs", kAdmin);
  ASSERT_TRUE(all);
  EXPECT_EQ(json::parse(all->body).size(), 4u);
}

// Registrations and link reports carry the signature of the cluster they concern; anything else is refused and
// the daemon goes on.
TEST(SchedulerServiceAuth, ClustersRegisterAndReportLinksOnlyUnderTheirOwnSignature) {
  if (sodium_init() < 0) GTEST_SKIP();
  unsigned char pk[32], sk[64], east_pk[32], east_sk[64];
  crypto_sign_keypair(pk, sk);
  crypto_sign_keypair(east_pk, east_sk);
  ClusterKeys keys;
  std::copy(pk, pk + 32, keys["south"].begin());
  std::copy(east_pk, east_pk + 32, keys["a"].begin());  // cluster "a" of the rig
  Rig rig(guarded_options(keys));
  const int port = rig.service->port();
  const std::string south =
      "name = \"south\"\n[devices.l4]\npeak_tflops = { fp32 = 30, bf16 = 121 }\nmemory_gb = 24\nmemory_bandwidth_gbs = 300\n"
      "power_w = 72\nprice_per_hour = 0.8\n[[clusters]]\nname = \"south\"\ndevice = \"l4\"\nhosts = 1\ndevices_per_host = 8\n";
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  auto signed_by = [&](const unsigned char* key, const std::string& who, const std::string& path, const std::string& body,
                       int64_t at) {
    return httplib::Headers{{kSignatureHeader, sign_request(who, key, "POST", path, body, at)}};
  };
  EXPECT_EQ(status_of(call(port, "POST", "/api/clusters", kAdmin, south)), 401) << "an admin token is not a signature";
  EXPECT_EQ(status_of(call(port, "POST", "/api/clusters", "", south, signed_by(east_sk, "a", "/api/clusters", south, now))), 403)
      << "a registering south";
  EXPECT_EQ(status_of(call(port, "POST", "/api/clusters", "", south, signed_by(east_sk, "south", "/api/clusters", south, now))), 401)
      << "a's key posing as south";
  const auto good = signed_by(sk, "south", "/api/clusters", south, now);
  auto added = call(port, "POST", "/api/clusters", "", south, good);
  ASSERT_TRUE(added);
  EXPECT_EQ(added->status, 201) << added->body;
  auto replayed = call(port, "POST", "/api/clusters", "", south, good);
  EXPECT_EQ(status_of(replayed), 401);
  EXPECT_TRUE(replayed && contains(replayed->body, "replay")) << (replayed ? replayed->body : "");
  const std::string others = json{{"a", "a"}, {"b", "b"}, {"bandwidth_gbps", 1.0}}.dump();
  EXPECT_EQ(status_of(call(port, "POST", "/api/links", "", others, signed_by(sk, "south", "/api/links", others, now))), 403)
      << "south reporting a link between two others";
  const std::string own = json{{"a", "a"}, {"b", "south"}, {"bandwidth_gbps", 1.0}}.dump();
  auto reported = call(port, "POST", "/api/links", "", own, signed_by(sk, "south", "/api/links", own, now));
  ASSERT_TRUE(reported);
  EXPECT_EQ(reported->status, 200) << reported->body;
  EXPECT_EQ(status_of(call(port, "GET", "/api/health", kRead)), 200) << "the daemon is up";
}

// Beyond loopback the API is served over HTTPS: a client that trusts the certificate gets answers; a plain-HTTP
// client gets none.
TEST(SchedulerServiceAuth, ServesHttpsWithTheCertificateItIsGiven) {
  const fs::path dir = crosstrain::testing::scratch_dir("service-tls");
  const std::string cert = (dir / "cert.pem").string(), key = (dir / "key.pem").string();
  const auto made = crosstrain::testing::run_process(
      {"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", key,
       "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"},
      {}, std::chrono::milliseconds(30000));
  if (made.exit_code() != 0) GTEST_SKIP() << "openssl could not make a certificate: " << made.output;
  ServiceOptions o = guarded_options();
  o.tls_cert = cert;
  o.tls_key = key;
  Rig rig(o);
  httplib::SSLClient tls("127.0.0.1", rig.service->port());
  tls.set_ca_cert_path(cert.c_str());
  tls.enable_server_certificate_verification(true);
  auto r = tls.Get("/api/health", {{"Authorization", std::string("Bearer ") + kRead}});
  ASSERT_TRUE(r) << httplib::to_string(r.error());
  EXPECT_EQ(r->status, 200) << r->body;
  httplib::SSLClient untrusting("127.0.0.1", rig.service->port());
  untrusting.enable_server_certificate_verification(true);
  untrusting.set_ca_cert_path("/dev/null");
  EXPECT_FALSE(untrusting.Get("/api/health")) << "a certificate nobody vouched for was accepted";
  EXPECT_FALSE(call(rig.service->port(), "GET", "/api/health", kRead)) << "plain HTTP was answered";
  ServiceOptions half = guarded_options();
  half.tls_cert = cert;
  EXPECT_THROW(SchedulerService(rig.sched, rig.store, "127.0.0.1", 0, std::chrono::milliseconds(200), half), UsageError);
  fs::remove_all(dir);
}

}  // namespace crosstrain::scheduler

namespace crosstrain::scheduler {
namespace {

// A request of the fuzzer below: random and malformed, built from a seeded generator.
struct FuzzRequest {
  std::string method, path, body, token;
};

FuzzRequest fuzz_request(std::mt19937& rng) {
  auto pick = [&](std::initializer_list<const char*> from) {
    return std::string(*(from.begin() + std::uniform_int_distribution<size_t>(0, from.size() - 1)(rng)));
  };
  auto bytes = [&](size_t most) {
    std::string s(std::uniform_int_distribution<size_t>(0, most)(rng), '\0');
    for (char& c : s) c = static_cast<char>(rng());
    return s;
  };
  const std::string valid = R"({"name": "fuzz", "ranks": 2, "steps": 10, "model": {"layers": 2, "hidden": 64, "heads": 4}})";
  FuzzRequest r;
  r.method = pick({"GET", "POST", "POST", "DELETE", "PUT"});
  r.path = pick({"/api/jobs", "/api/jobs", "/api/clusters", "/api/links", "/api/health", "/api/jobs/77",
                 "/api/jobs/99999999999999999999999", "/api/jobs/-1", "/api/jobs/2/metrics?since=abc",
                 "/api/jobs/2/metrics?since=99999999999999999999", "/api/jobs/2/report", "/api/jobs/2/events",
                 "/api/../../etc/passwd", "/api/jobs/%00", "/chart.js", "/"});
  switch (rng() % 8) {
    case 0: r.body = bytes(2000); break;
    case 1: {  // a valid spec with one character dropped, doubled or changed
      r.body = valid;
      const size_t at = rng() % r.body.size();
      if (rng() % 3 == 0) r.body.erase(at, 1);
      else if (rng() % 2) r.body.insert(at, 1, r.body[at]);
      else r.body[at] = static_cast<char>(rng());
      break;
    }
    case 2: r.body = std::string(20000 + rng() % 50000, '[') + std::string(10, ']'); break;  // deep nesting
    case 3: r.body = pick({R"({"name": 5})", R"({"ranks": "many"})", R"({"ranks": 1e300})", R"({"ranks": -4})",
                           R"([1, 2, 3])", R"(null)", R"({"model": {"heads": 0, "layers": 2, "hidden": 64}, "ranks": 2})",
                           R"({"name": "x", "ranks": 2, "set": ["run.dir=/tmp/owned"]})",
                           R"({"a": "x", "b": "y", "bandwidth_gbps": "fast"})"});
      break;
    case 4: r.body = "name = \"" + bytes(40) + "\"\n[[clusters]]\nname = \"q\"\nhosts = " + std::to_string(rng()) + "\n"; break;
    case 5: r.body = std::string(900 * 1024, 'a'); break;
    case 6: r.body = valid; break;
    default: r.body = ""; break;
  }
  r.token = pick({"", "", "admin", "read", "garbage-token-000000000000"});
  // Jobs 1 to 3 are the rig's: the fuzzer may not cancel them with a real token (that is allowed, not an attack).
  if (r.method == "DELETE" && r.path == "/api/jobs/77" && r.token == "admin") r.token = "read";
  return r;
}

}  // namespace

// Issue 34: 10,000 random and malformed requests (random bytes, broken and hostile job specs, JSON nested 20,000
// deep, 900 KB bodies, odd paths, no token, the wrong token) leave the daemon answering and the jobs it had as
// they were; what it accepts is only what an admin could legitimately submit.
TEST(SchedulerServiceInput, TenThousandRandomAndMalformedRequestsLeaveTheDaemonUpAndItsJobsIntact) {
  Rig rig(guarded_options());
  const int port = rig.service->port();
  auto jobs = [&] {
    auto r = call(port, "GET", "/api/jobs", kRead);
    return r && r->status == 200 ? json::parse(r->body) : json();
  };
  const json before = jobs();
  ASSERT_EQ(before.size(), 3u);
  std::mt19937 rng(20261207);
  int accepted = 0, server_errors = 0, no_answer = 0;
  for (int i = 0; i < 10000; ++i) {
    const FuzzRequest f = fuzz_request(rng);
    const std::string token = f.token == "admin" ? kAdmin : f.token == "read" ? kRead : f.token;
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5);
    client.set_read_timeout(10);
    httplib::Headers h;
    if (!token.empty()) h.emplace("Authorization", "Bearer " + token);
    httplib::Result r = f.method == "GET"      ? client.Get(f.path, h)
                        : f.method == "DELETE" ? client.Delete(f.path, h)
                        : f.method == "PUT"    ? client.Put(f.path, h, f.body, "application/json")
                                               : client.Post(f.path, h, f.body, "application/json");
    // A client still writing a large body when the daemon has already refused it sees the connection close (the
    // daemon does not read what it refused): that is an answer, not an outage.
    if (!r && f.body.size() > 64 * 1024 && r.error() == httplib::Error::Write) continue;
    if (!r) {
      if (++no_answer <= 3)
        ADD_FAILURE() << "no answer (" << httplib::to_string(r.error()) << ") to " << f.method << " " << f.path << " ["
                      << f.body.size() << " bytes: " << f.body.substr(0, 40) << "]";
      continue;
    }
    server_errors += r->status >= 500;
    if (r->status >= 500 && server_errors <= 3)
      ADD_FAILURE() << f.method << " " << f.path << " [" << f.body.substr(0, 80) << "] -> " << r->status << " " << r->body;
    if (f.method == "POST" && f.path == "/api/jobs" && r->status == 201) {
      ++accepted;
      EXPECT_EQ(f.token, "admin") << "a job was accepted without an admin token: " << f.body.substr(0, 200);
    }
  }
  EXPECT_EQ(server_errors, 0) << "requests that made the daemon fail (500)";
  EXPECT_LT(no_answer, 100) << "the daemon stopped answering (a request it could not parse is answered, not dropped)";
  auto health = call(port, "GET", "/api/health", kRead);
  ASSERT_TRUE(health) << "the daemon is down";
  EXPECT_EQ(health->status, 200);
  const json after = jobs();
  ASSERT_EQ(after.size(), 3u + accepted);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(after[i]["id"], before[i]["id"]);
    EXPECT_EQ(after[i]["name"], before[i]["name"]);
    EXPECT_EQ(after[i]["state"], before[i]["state"]) << "job " << before[i]["id"];
  }
}

}  // namespace crosstrain::scheduler

namespace crosstrain::scheduler {
namespace {

// Slurm-like answers: each status() and lost_clusters() takes `delay` (a controller that answers slowly); what it
// answers can be changed by the test.
class SlowExecutor : public Executor {
 public:
  void start(const JobRecord& job, const PlacementRecord&) override {
    std::this_thread::sleep_for(start_delay.load());
    note("start " + std::to_string(job.id));
    if (fail_starts.load() > 0) {
      --fail_starts;
      throw Error("sbatch: error: Batch job submission failed: Unable to contact slurm controller");
    }
    ++starts;
  }
  void stop(int64_t id) override { note("stop " + std::to_string(id)); }
  void note(const std::string& what) {
    std::lock_guard<std::mutex> lock(m);
    actions.push_back(what);
  }
  // Each answer is what held when the question came; it arrives `delay` later.
  ExecStatus status(int64_t) override {
    ExecStatus now;
    {
      std::lock_guard<std::mutex> lock(m);
      now = answer;
    }
    std::this_thread::sleep_for(delay.load());
    return now;
  }
  std::vector<std::string> lost_clusters() override {
    std::vector<std::string> now;
    {
      std::lock_guard<std::mutex> lock(m);
      now = lost;
    }
    std::this_thread::sleep_for(delay.load());
    return now;
  }
  std::atomic<std::chrono::milliseconds> delay{std::chrono::milliseconds(0)};
  std::vector<std::string> lost;
  std::mutex m;
  ExecStatus answer{ExecStatus::Running, 0, 0, "running", -1};
  std::atomic<int> starts{0};
  std::atomic<std::chrono::milliseconds> start_delay{std::chrono::milliseconds(0)};  // an sbatch that takes its time
  std::atomic<int> fail_starts{0};  // the next starts that fail
  std::vector<std::string> actions;
};

// The executor's slow questions are asked without the service's lock: while the ticker waits 3 s for an answer,
// the API answers at once; the scheduler then acts on what was observed (the job ends done).
TEST(ObservedExecutor, TheApiAnswersWhileTheExecutorIsAskedAndTheTickActsOnTheAnswer) {
  const fs::path dir = fresh_dir();
  SlowExecutor slow;
  ObservedExecutor observed(slow);
  StateStore store((dir / "state.db").string());
  Scheduler sched(testing::two_clusters(10), store, observed);
  sched.submit(spec("slowly-observed"));
  sched.tick();
  ASSERT_EQ(sched.job(1).state, JobState::Running);
  slow.delay = std::chrono::milliseconds(3000);
  ServiceOptions options;
  options.observed = &observed;
  SchedulerService service(sched, store, "127.0.0.1", 0, std::chrono::milliseconds(100), options);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // the ticker is inside its first observation
  httplib::Client client("127.0.0.1", service.port());
  client.set_read_timeout(10);
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = client.Get("/api/jobs/1");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, 200);
    EXPECT_LT(s, 1.0) << "the API waited for the executor";
  }
  {
    std::lock_guard<std::mutex> lock(slow.m);
    slow.answer = {ExecStatus::Done, 1000, 1000, "done", -1};
  }
  slow.delay = std::chrono::milliseconds(0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  std::string state;
  while (state != "done" && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const auto r = client.Get("/api/jobs/1");
    if (r && r->status == 200) state = json::parse(r->body).value("state", "");
  }
  EXPECT_EQ(state, "done");
  service.stop();
  fs::remove_all(dir);
}

// The usage joins the ledger's claims (what each cluster signed, per computation) to the jobs' users: job 2's
// claims count for its user on each cluster; a computation the scheduler never ran is shown apart; a ledger that
// does not verify says so on every row.
TEST(SchedulerServiceRun, UsageJoinsTheLedgersClaimsToTheJobsUsers) {
  auto claims = std::make_shared<LedgerClaims>();
  claims->message = "ok: 3 entries";
  claims->claims = {{"trains-2.a1", "a", 10, 15360, 2e12}, {"trains-2.a2", "a", 5, 7680, 1e12},
                    {"trains-2.a1", "b", 10, 15360, 2e12}, {"elsewhere-99.a1", "b", 1, 100, 1e9}};
  ServiceOptions options;
  options.ledger_claims = [claims] { return *claims; };
  Rig rig(std::move(options));
  const std::string user = rig.sched.job(2).spec.user;
  auto find = [](const json& rows, const std::string& who, const std::string& cluster) {
    for (const auto& r : rows)
      if (r["user"] == who && r["cluster"] == cluster) return r;
    return json();
  };
  json rows = rig.get_json("/api/usage", 200);
  const json a = find(rows, user, "a"), b = find(rows, user, "b");
  ASSERT_FALSE(a.is_null()) << rows.dump();
  EXPECT_EQ(a["steps"], 15);
  EXPECT_EQ(a["tokens"], 23040);
  EXPECT_DOUBLE_EQ(a["flops"].get<double>(), 3e12);
  EXPECT_EQ(b["tokens"], 15360) << rows.dump();
  EXPECT_EQ(a["ledger"], "verified");
  EXPECT_EQ(find(rows, "(not a job of this scheduler)", "b")["tokens"], 100) << rows.dump();
  claims->verified = false;
  claims->message = "line 3: the signature does not match";
  rows = rig.get_json("/api/usage", 200);
  EXPECT_EQ(find(rows, user, "a")["ledger"], "refused: line 3: the signature does not match") << rows.dump();
}

// A cluster that registers again while the ticker is asking about the clusters: the answer, from before, said it
// was lost; the tick does not mark it lost once more.
TEST(ObservedExecutor, AClusterThatRegistersAgainMeanwhileStaysUp) {
  const fs::path dir = fresh_dir();
  SlowExecutor slow;
  slow.lost = {"b"};
  ObservedExecutor observed(slow);
  StateStore store((dir / "state.db").string());
  Scheduler sched(testing::two_clusters(10), store, observed);
  ServiceOptions options;
  options.observed = &observed;
  SchedulerService service(sched, store, "127.0.0.1", 0, std::chrono::milliseconds(50), options);
  httplib::Client client("127.0.0.1", service.port());
  client.set_read_timeout(10);
  auto b_up = [&] {
    const auto r = client.Get("/api/clusters");
    const json all = json::parse(r->body);
    for (const auto& c : all["clusters"])
      if (c["name"] == "b") return c["up"].get<bool>();
    return true;
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (b_up() && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_FALSE(b_up()) << "b was never marked lost: " << client.Get("/api/clusters")->body;
  // b's controller answers again, but the ticker's next question is slow: b registers while it is being asked.
  slow.delay = std::chrono::milliseconds(1500);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  {
    std::lock_guard<std::mutex> lock(slow.m);
    slow.lost.clear();
  }
  std::string toml;
  for (const ClusterRow& row : store.clusters())
    if (row.name == "b") toml = row.spec_toml;
  const auto registered = client.Post("/api/clusters", toml, "application/toml");
  ASSERT_TRUE(registered) << httplib::to_string(registered.error());
  ASSERT_EQ(registered->status, 200) << registered->body;
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));  // the stale answer, then fresh ones
  EXPECT_TRUE(b_up()) << "b was marked lost again from an answer older than its registration";
  int lost_events = 0;
  for (const EventRow& e : store.events(0)) lost_events += e.kind == "cluster-lost";
  EXPECT_EQ(lost_events, 1);
  service.stop();
  fs::remove_all(dir);
}

// An answer about a job that started or stopped while it was being asked says nothing about it now: dropped.
TEST(ObservedExecutor, AnAnswerOlderThanTheJobsLastChangeIsDropped) {
  SlowExecutor slow;
  ObservedExecutor observed(slow);
  EXPECT_EQ(observed.status(7).kind, ExecStatus::Unknown) << "not observed yet";
  slow.answer = {ExecStatus::Failed, 30, 20, "share 1 exited with 1", 1};  // before any question: no lock needed
  slow.delay = std::chrono::milliseconds(500);
  std::thread ticker([&] { observed.observe({7}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  JobRecord job;
  job.id = 7;
  observed.start(job, PlacementRecord{});  // the job starts again while the failure is being reported
  ticker.join();
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  EXPECT_EQ(observed.status(7).kind, ExecStatus::Unknown) << observed.status(7).detail;
  slow.delay = std::chrono::milliseconds(0);
  observed.observe({7});
  EXPECT_EQ(observed.status(7).kind, ExecStatus::Failed);
  EXPECT_EQ(observed.status(7).checkpoint_step, 20);
  observed.stop(7);
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  EXPECT_EQ(observed.status(7).kind, ExecStatus::Unknown);
  EXPECT_EQ(observed.status(7).checkpoint_step, 20) << "its newest checkpoint stays known";
  EXPECT_EQ(slow.starts.load(), 1);
}

// Starting a job (sbatch per share) happens on the observed executor's thread, not under the service's lock: while
// a start takes 3 s the API answers at once and the job reads as being started; the starts and stops are made in the
// order the scheduler decided them.
TEST(ObservedExecutor, StartsAndStopsAreMadeOffTheLockInTheOrderDecided) {
  const fs::path dir = fresh_dir();
  SlowExecutor slow;
  slow.start_delay = std::chrono::milliseconds(3000);
  ObservedExecutor observed(slow);
  StateStore store((dir / "state.db").string());
  Scheduler sched(testing::two_clusters(10), store, observed);
  sched.submit(spec("started-aside"));
  ServiceOptions options;
  options.observed = &observed;
  SchedulerService service(sched, store, "127.0.0.1", 0, std::chrono::milliseconds(50), options);
  httplib::Client client("127.0.0.1", service.port());
  client.set_read_timeout(10);
  // Placed by the ticker's first pass; its start is under way for 3 s.
  const auto placed_until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (observed.status(1).detail != "being started or stopped" && std::chrono::steady_clock::now() < placed_until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(observed.status(1).kind, ExecStatus::Unknown);
  EXPECT_EQ(observed.status(1).detail, "being started or stopped");
  for (int i = 0; i < 3; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = client.Get("/api/jobs/1");
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(json::parse(r->body).value("state", ""), "running");
    EXPECT_LT(s, 1.0) << "the API waited for the start";
  }
  service.stop();
  slow.start_delay = std::chrono::milliseconds(0);
  JobRecord job;
  job.id = 2;
  observed.start(job, PlacementRecord{});
  observed.stop(2);
  observed.start(job, PlacementRecord{});
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(10000)));
  std::lock_guard<std::mutex> lock(slow.m);
  EXPECT_EQ(slow.actions, (std::vector<std::string>{"start 1", "start 2", "stop 2", "start 2"}));
  fs::remove_all(dir);
}

// A start that fails on the executor's thread (a controller that does not answer sbatch) is reported by the next
// status and puts the job back in the queue, as a start that throws does, without using one of its restarts; the
// next pass starts it.
TEST(ObservedExecutor, AStartThatFailsQueuesTheJobAgainWithoutUsingARestart) {
  const fs::path dir = fresh_dir();
  SlowExecutor slow;
  slow.fail_starts = 1;
  ObservedExecutor observed(slow);
  StateStore store((dir / "state.db").string());
  Scheduler sched(testing::two_clusters(10), store, observed);
  sched.submit(spec("unlucky"));
  sched.tick();
  ASSERT_EQ(sched.job(1).state, JobState::Running) << "started in the background";
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  sched.tick();  // reads the failure, queues it again; the same pass places it once more
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  int failed = 0;
  for (const EventRow& e : store.events(1))
    if (e.kind == "start-failed") {
      ++failed;
      EXPECT_NE(e.detail.find("Unable to contact slurm controller"), std::string::npos) << e.detail;
    }
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(sched.job(1).restarts, 0);
  EXPECT_EQ(sched.job(1).state, JobState::Running);
  EXPECT_EQ(slow.starts.load(), 1);
  fs::remove_all(dir);
}

// What was observed of a job while an action for it waited in the queue, and a start that failed before a stop and
// another start were decided, say nothing about the job once those actions are made.
TEST(ObservedExecutor, WhatWasSeenOrFailedBeforeTheLatestActionDoesNotCount) {
  SlowExecutor slow;
  slow.answer = {ExecStatus::Failed, 30, 20, "share 0 exited with 1", 0};
  slow.start_delay = std::chrono::milliseconds(800);
  ObservedExecutor observed(slow);
  JobRecord one, two;
  one.id = 1;
  two.id = 2;
  observed.start(one, PlacementRecord{});  // takes 0.8 s: job 2's stop waits behind it
  observed.stop(2);
  observed.observe({2});  // answers at once, from before the stop is made
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  EXPECT_EQ(observed.status(2).kind, ExecStatus::Unknown) << observed.status(2).detail;

  slow.fail_starts = 1;
  JobRecord three;
  three.id = 3;
  observed.start(three, PlacementRecord{});  // fails after 0.8 s, once the stop and the new start are decided
  observed.stop(3);
  observed.start(three, PlacementRecord{});
  ASSERT_TRUE(observed.settle(std::chrono::milliseconds(5000)));
  EXPECT_FALSE(observed.status(3).start_failed) << "the failure of a start that a newer one replaced";
  EXPECT_EQ(slow.starts.load(), 2);
}

}  // namespace
}  // namespace crosstrain::scheduler
