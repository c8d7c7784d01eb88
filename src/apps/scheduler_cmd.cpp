#include "scheduler_cmd.h"

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <thread>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/interrupt.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/service.h"
#include "crosstrain/scheduler/sim_executor.h"
#include "crosstrain/scheduler/state_store.h"
#include "report_cmd.h"

namespace crosstrain::apps {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The simulated executor on the wall clock: a job's simulated steps advance as real time passes, so the daemon can
// be watched (and killed and restarted) while its jobs "run". Real clusters: scheduler/slurm_executor.h.
class WallClockSimulation : public scheduler::Executor {
 public:
  explicit WallClockSimulation(scheduler::SimulatedExecutor sim) : sim_(std::move(sim)), start_(Clock::now()) {}
  void start(const scheduler::JobRecord& j, const scheduler::PlacementRecord& p) override { sync(), sim_.start(j, p); }
  void stop(int64_t id) override { sync(), sim_.stop(id); }
  scheduler::ExecStatus status(int64_t id) override {
    sync();
    return sim_.status(id);
  }
  std::vector<std::string> lost_clusters() override { return sim_.lost_clusters(); }

 private:
  void sync() { sim_.advance(std::chrono::duration<double>(Clock::now() - start_).count() - sim_.now()); }
  scheduler::SimulatedExecutor sim_;
  Clock::time_point start_;
};

int serve(const SchedulerCli& cli) {
  if (cli.state.empty()) throw UsageError("scheduler: give --state FILE (the SQLite file that keeps every job)");
  if (cli.clusters.empty()) throw UsageError("scheduler: give --clusters FILE (a cluster file, e.g. clusters/three-clusters.toml)");
  auto registry = scheduler::Registry::from_cluster_file(planner::load_cluster(cli.clusters));
  scheduler::StateStore store(cli.state);
  WallClockSimulation executor(scheduler::SimulatedExecutor::for_registry(registry));
  const auto start = Clock::now();
  scheduler::Scheduler sched(std::move(registry), store, executor, {},
                             [start] { return std::chrono::duration<double>(Clock::now() - start).count(); });
  // A real executor finds its running jobs again (Slurm's job folders); the simulation has no memory across
  // processes, so it takes back every job the store says is running, from the step it had reached.
  for (const int64_t id : sched.active())
    if (const auto& job = sched.job(id); job.placement) executor.start(job, *job.placement);
  // Each recipe job's run report comes from obs, which the scheduler layer cannot reach: report_cmd.h renders it.
  scheduler::SchedulerService service(sched, store, cli.host, cli.port, std::chrono::milliseconds(cli.tick_ms),
                                      scheduler::ServiceOptions{report_page});
  std::printf("crosstrain scheduler: %zu jobs recovered from %s; serving http://%s:%d/api (Ctrl-C stops)\n",
              sched.jobs().size(), cli.state.c_str(), cli.host.c_str(), service.port());
  std::fflush(stdout);
  catch_interrupt();  // Ctrl-C and SIGTERM end the daemon between passes; the state is already on disk
  while (!interrupt_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  service.stop();
  std::printf("crosstrain scheduler: stopped; %s keeps every job\n", cli.state.c_str());
  return 0;
}

// host:port of --server ("http://127.0.0.1:8650").
httplib::Client client(const std::string& server) {
  httplib::Client c(server);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  return c;
}

json call(const SchedulerCli& cli, const std::string& method, const std::string& path, const std::string& body = "") {
  auto c = client(cli.server);
  httplib::Result r = method == "GET"    ? c.Get(path)
                      : method == "POST" ? c.Post(path, body, "application/json")
                                         : c.Delete(path);
  if (!r)
    throw UsageError("job: no scheduler answers at " + cli.server + " (" + httplib::to_string(r.error()) +
                     "); start one with `crosstrain scheduler --state FILE --clusters FILE`, or give --server");
  json j = json::parse(r->body, nullptr, false);
  if (r->status >= 400) throw UsageError("job: " + (j.is_object() ? j.value("error", r->body) : r->body));
  return j;
}

std::string spec_of(const SchedulerCli& cli) {
  if (!cli.spec.empty()) {
    std::ifstream in(cli.spec);
    if (!in) throw UsageError("job submit: cannot read the job spec '" + cli.spec + "'");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  json j = {{"name", cli.name}, {"model", cli.model}, {"ranks", cli.ranks}, {"steps", cli.steps},
            {"qos", {{"deadline_s", cli.deadline_s}, {"budget", cli.budget}, {"max_wan_gbps", cli.max_wan_gbps}}}};
  return j.dump();
}

void print_job(const json& j) {
  std::string where;
  if (j["placement"].is_object())
    for (const auto& s : j["placement"]["shares"])
      where += (where.empty() ? "" : " + ") + s["cluster"].get<std::string>() + ":" + std::to_string(s["ranks"].get<int>());
  std::printf("%-5lld %-16s %-9s ranks %-5d attempts %d step %-7lld %s%s%s\n", j["id"].get<long long>(),
              j["name"].get<std::string>().c_str(), j["state"].get<std::string>().c_str(), j["ranks"].get<int>(),
              j["attempts"].get<int>(), j["step"].get<long long>(), where.c_str(),
              j["placement"].is_object() ? (" " + j["placement"]["sync"].get<std::string>()).c_str() : "",
              j["reason"].get<std::string>().empty() ? "" : ("  (" + j["reason"].get<std::string>() + ")").c_str());
}

int client_command(const SchedulerCli& cli) {
  if (*cli.submit) {
    const json r = call(cli, "POST", "/api/jobs", spec_of(cli));
    const std::string state = r["state"].get<std::string>(), reason = r.value("reason", "");
    std::printf("job %lld %s%s\n", r["id"].get<long long>(), state.c_str(), reason.empty() ? "" : (": " + reason).c_str());
    return state == "failed" ? 1 : 0;
  }
  if (*cli.status) {
    if (cli.id >= 0) print_job(call(cli, "GET", "/api/jobs/" + std::to_string(cli.id)));
    else
      for (const auto& j : call(cli, "GET", "/api/jobs")) print_job(j);
    return 0;
  }
  if (*cli.logs) {
    for (const auto& e : call(cli, "GET", "/api/jobs/" + std::to_string(cli.id) + "/events"))
      std::printf("%10.3f  %-12s %s\n", e["time_s"].get<double>(), e["kind"].get<std::string>().c_str(),
                  e["detail"].get<std::string>().c_str());
    return 0;
  }
  const json r = call(cli, "DELETE", "/api/jobs/" + std::to_string(cli.id));
  std::printf("job %lld %s\n", r["id"].get<long long>(), r["state"].get<std::string>().c_str());
  return 0;
}

}  // namespace

bool SchedulerCli::selected() const { return (serve && *serve) || (submit && (*submit || *status || *logs || *cancel)); }

void add_scheduler_commands(CLI::App& app, SchedulerCli& cli) {
  cli.serve = app.add_subcommand("scheduler", "the compute-network scheduler daemon: jobs in SQLite, an HTTP/JSON API");
  cli.serve->add_option("--state", cli.state, "SQLite file holding every job (created; a restart recovers it)");
  cli.serve->add_option("--clusters", cli.clusters, "cluster file: clusters, devices, prices, links");
  cli.serve->add_option("--host", cli.host, "address to listen on");
  cli.serve->add_option("--port", cli.port, "port of the API (0: any free one)");
  cli.serve->add_option("--tick-ms", cli.tick_ms, "milliseconds between scheduling passes");
  auto* job = app.add_subcommand("job", "submit, watch and cancel jobs of a running scheduler");
  job->require_subcommand(1);
  job->add_option("--server", cli.server, "the scheduler's address")->capture_default_str();
  cli.submit = job->add_subcommand("submit", "queue a job");
  cli.submit->add_option("--spec", cli.spec, "a JSON job spec (else the options below)");
  cli.submit->add_option("--name", cli.name, "job name");
  cli.submit->add_option("--model", cli.model, "a model preset (crosstrain plan --help lists them)");
  cli.submit->add_option("--ranks", cli.ranks, "devices, started together");
  cli.submit->add_option("--steps", cli.steps, "training steps");
  cli.submit->add_option("--deadline-s", cli.deadline_s, "QoS: finish within this many seconds");
  cli.submit->add_option("--budget", cli.budget, "QoS: most the run may cost");
  cli.submit->add_option("--max-wan-gbps", cli.max_wan_gbps, "QoS: most wide-area bandwidth (0: one cluster only)");
  cli.status = job->add_subcommand("status", "every job, or one");
  cli.status->add_option("id", cli.id, "job id");
  cli.logs = job->add_subcommand("logs", "a job's events: submitted, placed, started, re-placed, ended");
  cli.logs->add_option("id", cli.id, "job id")->required();
  cli.cancel = job->add_subcommand("cancel", "stop a job wherever it runs");
  cli.cancel->add_option("id", cli.id, "job id")->required();
}

int run_scheduler_command(const SchedulerCli& cli) {
  if (*cli.serve) return serve(cli);
  return client_command(cli);
}

}  // namespace crosstrain::apps
