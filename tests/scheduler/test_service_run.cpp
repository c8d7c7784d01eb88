// Each job's live metrics and report through the scheduler's service (service.h), with an executor whose jobs
// have run folders the test writes: GET /api/jobs/ID/metrics (the tail of metrics.jsonl, a torn last line left
// out, ?since=), GET /api/jobs/ID/report (through the renderer the apps pass in, 404s naming why), /chart.js, and
// the dashboard rendered in headless Chromium with a job selected: its figures and charts drawn. No training.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

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
