#include "scheduler_cmd.h"

#include <httplib.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <ctime>
#include <thread>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/interrupt.h"
#include "crosstrain/core/names.h"
#include "crosstrain/ledger/ledger.h"
#include "crosstrain/scheduler/api_auth.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/service.h"
#include "crosstrain/planner/model_shape.h"
#include "crosstrain/scheduler/local_executor.h"
#include "crosstrain/scheduler/sim_executor.h"
#include "crosstrain/scheduler/slurm_executor.h"
#include "crosstrain/scheduler/state_store.h"
#include "crosstrain/scheduler/train_share.h"
#include "crosstrain/train/config.h"
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

// The path of this binary, which the ranks of recipe jobs run.
std::string own_binary() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("crosstrain") : path.string();
}

// --slurm NAME=SLURM_CONF[:PARTITION] for every cluster of the cluster file.
std::vector<scheduler::SlurmCluster> slurm_clusters(const SchedulerCli& cli, const scheduler::Registry& registry) {
  std::vector<scheduler::SlurmCluster> out;
  for (const std::string& s : cli.slurm) {
    const auto eq = s.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError("scheduler: --slurm '" + s + "' is not NAME=SLURM_CONF[:PARTITION] (e.g. east=/etc/slurm-east/slurm.conf)");
    scheduler::SlurmCluster c;
    c.name = s.substr(0, eq);
    c.conf = s.substr(eq + 1);
    if (const auto colon = c.conf.find(':'); colon != std::string::npos)
      c.partition = c.conf.substr(colon + 1), c.conf.resize(colon);
    registry.index_of(c.name);  // names a cluster of the cluster file, or says which exist
    if (!std::filesystem::exists(c.conf))
      throw UsageError("scheduler: --slurm " + c.name + "=" + c.conf + ": no such file (the cluster's slurm.conf)");
    c.devices_per_node = registry.clusters()[registry.index_of(c.name)].devices_per_host;
    c.gpus = registry.clusters()[registry.index_of(c.name)].device != "cpu";  // the cluster file's device kind
    for (const std::string& e : cli.cluster_hosts)
      if (e.rfind(c.name + "=", 0) == 0) c.rendezvous_addr = e.substr(c.name.size() + 1);
    out.push_back(c);
  }
  for (const auto& info : registry.clusters()) {
    bool given = false;
    for (const auto& c : out) given = given || c.name == info.name;
    if (!given) throw UsageError("scheduler: --executor slurm needs --slurm " + info.name + "=SLURM_CONF for cluster '" +
                                 info.name + "' of " + cli.clusters);
  }
  return out;
}

// --quota USER=DEVICES, each user once.
std::map<std::string, int> parse_quotas(const std::vector<std::string>& entries) {
  std::map<std::string, int> quotas;
  for (const std::string& e : entries) {
    const auto eq = e.find('=');
    const std::string user = e.substr(0, eq);
    int devices = -1;
    try {
      size_t used = 0;
      if (eq != std::string::npos) devices = std::stoi(e.substr(eq + 1), &used);
      if (used != e.size() - eq - 1) devices = -1;
    } catch (const std::exception&) {
      devices = -1;
    }
    if (eq == std::string::npos || !is_valid_name(user) || devices < 0)
      throw UsageError("scheduler: --quota '" + e + "' is not USER=DEVICES (a user name and a whole number >= 0)");
    if (!quotas.emplace(user, devices).second) throw UsageError("scheduler: --quota names user '" + user + "' twice");
  }
  return quotas;
}

std::unique_ptr<scheduler::Executor> make_executor(const SchedulerCli& cli, const scheduler::Registry& registry) {
  if (cli.executor == "sim")
    return std::make_unique<WallClockSimulation>(scheduler::SimulatedExecutor::for_registry(registry));
  const std::string work = !cli.work_dir.empty() ? cli.work_dir
                                                 : (std::filesystem::absolute(cli.state).parent_path() / "jobs").string();
  scheduler::TrainLaunch launch;
  launch.crosstrain = own_binary();
  launch.master_host = cli.master_host;
  for (const std::string& e : cli.cluster_hosts) {
    const auto eq = e.find('=');
    const std::string name = e.substr(0, eq), host = eq == std::string::npos ? "" : e.substr(eq + 1);
    if (eq == std::string::npos || host.empty() || host.find_first_of(" \t'\"$;&|`") != std::string::npos)
      throw UsageError("scheduler: --cluster-host '" + e + "' is not CLUSTER=ADDRESS");
    registry.index_of(name);  // an unknown cluster: a UsageError naming the clusters
    launch.cluster_hosts[name] = host;
  }
  if (cli.ledger.empty() != cli.ledger_keys.empty())
    throw UsageError("scheduler: give --ledger FILE and --ledger-keys DIR together (DIR holds each cluster's "
                     "NAME.key and keys.json, from crosstrain ledger keygen)");
  if (!cli.ledger.empty()) {
    launch.ledger = std::filesystem::absolute(cli.ledger).string();
    launch.ledger_keys = std::filesystem::absolute(cli.ledger_keys).string();
    launch.claim_every_s = cli.claim_every_s;
    const size_t scheme = cli.ledger_url.find("://");
    if (!cli.ledger_url.empty() &&
        ((cli.ledger_url.rfind("http://", 0) != 0 && cli.ledger_url.rfind("https://", 0) != 0) ||
         cli.ledger_url.find('/', scheme + 3) != std::string::npos))
      throw UsageError("scheduler: --ledger-url '" + cli.ledger_url + "' is not http[s]://ADDRESS:PORT (no path)");
    launch.ledger_url = cli.ledger_url;
    launch.ledger_ca = cli.ledger_ca;
    for (const auto& c : registry.clusters())
      if (!std::filesystem::exists(std::filesystem::path(launch.ledger_keys) / (c.name + ".key")))
        throw UsageError("scheduler: --ledger-keys " + cli.ledger_keys + " has no key for cluster '" + c.name +
                         "'; make one with crosstrain ledger keygen --cluster " + c.name + " --out " + cli.ledger_keys);
  }
  if (cli.ledger.empty() && (!cli.ledger_url.empty() || !cli.ledger_ca.empty()))
    throw UsageError("scheduler: --ledger-url and --ledger-ca are where the shares reach the ledger: give --ledger FILE "
                     "and --ledger-keys DIR too");
  if (!cli.ledger_ca.empty() && cli.ledger_url.rfind("https://", 0) != 0)
    throw UsageError("scheduler: --ledger-ca is the certificate for an https:// --ledger-url");
  launch.sites = cli.site_storage;
  // On Slurm a share larger than one of its cluster's nodes spans several (srun starts a launcher on each).
  if (cli.executor == "slurm")
    for (const auto& c : registry.clusters()) launch.devices_per_node[c.name] = c.devices_per_host;
  auto command = scheduler::train_share_command(launch, work);
  if (cli.executor == "local")
    return std::make_unique<scheduler::LocalExecutor>(work, command, std::chrono::milliseconds(10000),
                                                      cli.max_local_ranks);
  if (cli.executor == "slurm") {
    auto clusters = slurm_clusters(cli, registry);
    // With sites, a share's output stays on its cluster's storage, beside the job's run folder there.
    if (cli.site_storage)
      for (auto& c : clusters) c.site_dir = scheduler::site_dir_of(work, c.name);
    return std::make_unique<scheduler::SlurmExecutor>(std::move(clusters), work, command);
  }
  throw UsageError("scheduler: --executor '" + cli.executor + "': use sim, local or slurm");
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Tokens, cluster keys and TLS of the daemon's API (scheduler/api_auth.h).
// The ledger's verified entries, totalled per computation and cluster, for the usage the API reports. Read on each
// request: it is the clusters' own record, appended to by their shares as they train.
scheduler::LedgerClaims read_ledger_claims(const std::string& ledger, const std::string& keys_json) {
  scheduler::LedgerClaims out;
  if (!std::filesystem::exists(ledger)) {
    out.message = "no entries yet";
    return out;
  }
  const scheduler::LedgerVerifyReport report = scheduler::verify_ledger(ledger, scheduler::read_public_keys(keys_json));
  out.verified = report.ok;
  out.message = report.message();
  std::map<std::pair<std::string, std::string>, scheduler::LedgerClaim> totals;
  for (const scheduler::LedgerEntry& e : report.parsed) {
    scheduler::LedgerClaim& c = totals[{e.job, e.cluster}];
    c.job = e.job, c.cluster = e.cluster;
    c.steps += e.steps, c.tokens += e.tokens, c.flops += e.flops;
  }
  for (auto& [key, claim] : totals) out.claims.push_back(std::move(claim));
  return out;
}

scheduler::ServiceOptions service_options(const SchedulerCli& cli) {
  scheduler::ServiceOptions o;
  o.report_html = report_page;
  const std::string tokens = cli.tokens.empty() ? cli.state + ".tokens" : cli.tokens;
  o.tokens = std::make_shared<scheduler::ApiTokens>(scheduler::ApiTokens::load_or_create(tokens));
  std::string keys = cli.cluster_keys;
  if (keys.empty() && !cli.ledger_keys.empty() &&
      std::filesystem::exists(std::filesystem::path(cli.ledger_keys) / "keys.json"))
    keys = (std::filesystem::path(cli.ledger_keys) / "keys.json").string();
  if (!keys.empty())
    for (const auto& [name, key] : scheduler::read_public_keys(keys)) o.cluster_keys[name] = key;
  o.tls_cert = cli.tls_cert;
  o.tls_key = cli.tls_key;
  if (!cli.ledger.empty()) {
    const std::string ledger = std::filesystem::absolute(cli.ledger).string();
    const std::string keys_json = (std::filesystem::absolute(cli.ledger_keys) / "keys.json").string();
    // Verified again only when the file changed (size or time): the dashboard asks every 2 s, and verifying checks
    // every entry's signature.
    struct Cache {
      std::mutex mutex;
      std::uintmax_t size = 0;
      std::filesystem::file_time_type time{};
      bool filled = false;
      scheduler::LedgerClaims claims;
    };
    auto cache = std::make_shared<Cache>();
    // The ledger over the API, for clusters that do not share this disk (--ledger-url).
    o.ledger_text = [ledger] { return scheduler::read_ledger_locked(ledger); };
    o.ledger_append = [ledger, keys_json](const std::string& line) {
      try {
        const scheduler::LedgerEntry e =
            scheduler::append_sealed_entry(ledger, line, scheduler::read_public_keys(keys_json));
        return scheduler::LedgerAppend{201, "appended entry " + std::to_string(e.seq) + " of cluster " + e.cluster};
      } catch (const scheduler::LedgerConflict& e) {
        return scheduler::LedgerAppend{409, e.what()};
      } catch (const UsageError& e) {
        return scheduler::LedgerAppend{400, e.what()};
      }
    };
    o.ledger_claims = [ledger, keys_json, cache] {
      std::error_code ec;
      const auto size = std::filesystem::file_size(ledger, ec);
      const auto time = ec ? std::filesystem::file_time_type{} : std::filesystem::last_write_time(ledger, ec);
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (!ec && cache->filled && cache->size == size && cache->time == time) return cache->claims;
      cache->claims = read_ledger_claims(ledger, keys_json);
      cache->filled = !ec;
      cache->size = ec ? 0 : size;
      cache->time = time;
      return cache->claims;
    };
  }
  if (!is_loopback(cli.host) && o.tls_cert.empty())
    throw UsageError("scheduler: --host " + cli.host + " listens beyond this machine: give --tls-cert and --tls-key "
                     "so that tokens and jobs do not cross the network in the clear (or keep --host 127.0.0.1)");
  return o;
}

int serve(const SchedulerCli& cli) {
  if (cli.state.empty()) throw UsageError("scheduler: give --state FILE (the SQLite file that keeps every job)");
  if (cli.clusters.empty()) throw UsageError("scheduler: give --clusters FILE (a cluster file, e.g. clusters/three-clusters.toml)");
  auto registry = scheduler::Registry::from_cluster_file(planner::load_cluster(cli.clusters));
  auto executor = make_executor(cli, registry);
  scheduler::StateStore store(cli.state);
  // The scheduler's clock is Unix time (its default): submission times and deadlines keep their meaning across
  // restarts of the daemon.
  scheduler::SchedulerOptions sched_options;
  sched_options.quotas = parse_quotas(cli.quotas);
  sched_options.preemption = !cli.no_preemption;
  sched_options.move_after_s = cli.move_after_s;
  // Slurm's answers take seconds (a dead controller the command timeout): asked without the scheduler's lock.
  std::unique_ptr<scheduler::ObservedExecutor> observed;
  if (cli.executor == "slurm") observed = std::make_unique<scheduler::ObservedExecutor>(*executor);
  scheduler::Scheduler sched(std::move(registry), store, observed ? *observed : *executor, sched_options);
  // A real executor finds its running jobs again (Slurm's and the local executor's job folders); the simulation
  // has no memory across processes, so it takes back every job the store says is running, from the step it had
  // reached.
  if (cli.executor == "sim")
    for (const int64_t id : sched.active())
      if (const auto& job = sched.job(id); job.placement) executor->start(job, *job.placement);
  const int64_t tick_ms = cli.tick_ms > 0 ? cli.tick_ms : (cli.executor == "sim" ? 100 : 1000);
  // Each recipe job's run report comes from obs, which the scheduler layer cannot reach: report_cmd.h renders it.
  scheduler::ServiceOptions options = service_options(cli);
  options.observed = observed.get();
  scheduler::SchedulerService service(sched, store, cli.host, cli.port, std::chrono::milliseconds(tick_ms), options);
  const std::string scheme = options.tls_cert.empty() ? "http" : "https";
  std::printf("crosstrain scheduler: %zu jobs recovered from %s; %s executor; serving %s://%s:%d/api (Ctrl-C stops)\n"
              "crosstrain scheduler: tokens in %s (crosstrain job --token-file FILE); %zu cluster keys; dashboard "
              "%s://%s:%d/#token=%s\n",
              sched.jobs().size(), cli.state.c_str(), cli.executor.c_str(), scheme.c_str(), cli.host.c_str(),
              service.port(), (cli.tokens.empty() ? cli.state + ".tokens" : cli.tokens).c_str(),
              options.cluster_keys.size(), scheme.c_str(), cli.host.c_str(), service.port(),
              options.tokens->token(scheduler::ApiRole::Read).c_str());
  std::fflush(stdout);
  catch_interrupt();  // Ctrl-C and SIGTERM end the daemon between passes; the state is already on disk
  while (!interrupt_requested()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  service.stop();
  std::printf("crosstrain scheduler: stopped; %s keeps every job\n", cli.state.c_str());
  return 0;
}

// --server ("http://127.0.0.1:8650", or https:// with --ca-cert for a certificate of one's own).
httplib::Client client(const SchedulerCli& cli) {
  httplib::Client c(cli.server);
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  if (!cli.ca_cert.empty()) c.set_ca_cert_path(cli.ca_cert.c_str());
  return c;
}

// The token a client sends: --token, else CROSSTRAIN_SCHEDULER_TOKEN, else the strongest of --token-file.
std::string client_token(const SchedulerCli& cli) {
  if (!cli.token.empty()) return cli.token;
  if (const char* t = std::getenv("CROSSTRAIN_SCHEDULER_TOKEN"); t && *t) return t;
  if (cli.token_file.empty()) return "";
  const auto tokens = scheduler::ApiTokens::load(cli.token_file);
  const std::string admin = tokens.token(scheduler::ApiRole::Admin);
  return admin.empty() ? tokens.token(scheduler::ApiRole::Read) : admin;
}

json call(const SchedulerCli& cli, const std::string& method, const std::string& path, const std::string& body = "") {
  auto c = client(cli);
  httplib::Headers headers;
  if (const std::string token = client_token(cli); !token.empty()) headers.emplace("Authorization", "Bearer " + token);
  if (!cli.key.empty()) {
    const scheduler::LedgerKey key = scheduler::read_ledger_key(cli.key);
    const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                         std::chrono::system_clock::now().time_since_epoch()).count();
    headers.emplace(scheduler::kSignatureHeader,
                    scheduler::sign_request(key.cluster, key.secret_key.data(), method, path, body, now));
  }
  httplib::Result r = method == "GET"    ? c.Get(path, headers)
                      : method == "POST" ? c.Post(path, headers, body, "application/json")
                                         : c.Delete(path, headers);
  if (!r)
    throw UsageError("job: no scheduler answers at " + cli.server + " (" + httplib::to_string(r.error()) +
                     "); start one with `crosstrain scheduler --state FILE --clusters FILE`, or give --server");
  json j = json::parse(r->body, nullptr, false);
  if (r->status >= 400) throw UsageError("job: " + (j.is_object() ? j.value("error", r->body) : r->body));
  return j;
}

// A recipe job: the model shape, batch and steps from the recipe (with --set), the recipe by absolute path (the
// ranks start elsewhere), and the overrides passed on to the ranks.
void recipe_spec(const SchedulerCli& cli, scheduler::JobSpec& spec) {
  const train::Config c = train::load_config(cli.recipe, cli.sets);
  if (c.model.arch == models::ModelArch::Dlrm)  // the planner models decoders' steps and memory
    throw UsageError("job submit: the scheduler places GPT and Llama recipes; " + cli.recipe + " has model.arch = " +
                     models::to_string(c.model.arch));
  spec.model = planner::from_gpt_config(c.model, c.run.name);
  spec.recipe = std::filesystem::absolute(cli.recipe).string();
  std::ifstream text(cli.recipe, std::ios::binary);
  std::ostringstream contents;
  contents << text.rdbuf();
  spec.recipe_text = contents.str();  // the ranks train from a copy at their site (no disk shared with this one)
  spec.overrides = cli.sets;
  spec.global_batch = cli.global_batch > 0 ? cli.global_batch : c.train.global_batch;
  spec.steps = cli.steps > 0 ? cli.steps : c.train.steps;
  spec.checkpoint_every = cli.checkpoint_every > 0 ? cli.checkpoint_every
                          : c.train.checkpoint_every > 0 ? c.train.checkpoint_every : spec.checkpoint_every;
}

std::string spec_of(const SchedulerCli& cli) {
  if (!cli.spec.empty()) {
    std::ifstream in(cli.spec);
    if (!in) throw UsageError("job submit: cannot read the job spec '" + cli.spec + "'");
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  if (!cli.sets.empty() && cli.recipe.empty()) throw UsageError("job submit: --set applies to --recipe jobs");
  scheduler::JobSpec spec;
  spec.name = cli.name;
  spec.ranks = cli.ranks;
  spec.min_ranks = cli.min_ranks;
  spec.max_restarts = cli.max_restarts;
  spec.user = cli.user;
  spec.priority = cli.priority;
  spec.qos = {cli.deadline_s, cli.budget, cli.max_wan_gbps};
  if (!cli.recipe.empty()) {
    recipe_spec(cli, spec);
  } else {
    spec.model = planner::model_preset(cli.model);
    spec.steps = cli.steps > 0 ? cli.steps : 1000;
    spec.global_batch = cli.global_batch;
    if (cli.checkpoint_every > 0) spec.checkpoint_every = cli.checkpoint_every;
  }
  return scheduler::job_spec_to_json(spec);
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

int cluster_command(const SchedulerCli& cli) {
  if (*cli.register_cluster) {
    std::ifstream in(cli.cluster_file);
    if (!in) throw UsageError("cluster register: cannot read '" + cli.cluster_file + "'");
    std::stringstream text;
    text << in.rdbuf();
    planner::parse_cluster(text.str(), cli.cluster_file);  // a bad file is refused here, naming the file and key
    const json r = call(cli, "POST", "/api/clusters", text.str());
    std::printf("cluster %s %s\n", r["cluster"].get<std::string>().c_str(), r["result"].get<std::string>().c_str());
    return 0;
  }
  const json body = {{"a", cli.link_a}, {"b", cli.link_b}, {"bandwidth_gbps", cli.bandwidth_gbps}, {"latency_us", cli.latency_us}};
  const json r = call(cli, "POST", "/api/links", body.dump());
  std::printf("link %s - %s: %.3f Gbit/s, %.0f us\n", cli.link_a.c_str(), cli.link_b.c_str(),
              r["bandwidth_Bps"].get<double>() * 8 / 1e9, r["latency_s"].get<double>() * 1e6);
  return 0;
}

int client_command(const SchedulerCli& cli) {
  if (*cli.register_cluster || *cli.link) return cluster_command(cli);
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
    const json events = call(cli, "GET", "/api/jobs/" + std::to_string(cli.id) + "/events");
    const double t0 = events.empty() ? 0 : events.front()["time_s"].get<double>();
    for (const auto& e : events) {
      // UTC time of day, and seconds since the job was submitted.
      const auto t = static_cast<std::time_t>(e["time_s"].get<double>());
      char clock[16];
      std::strftime(clock, sizeof clock, "%H:%M:%S", std::gmtime(&t));
      std::printf("%s  +%9.3f s  %-12s %s\n", clock, e["time_s"].get<double>() - t0, e["kind"].get<std::string>().c_str(),
                  e["detail"].get<std::string>().c_str());
    }
    return 0;
  }
  const json r = call(cli, "DELETE", "/api/jobs/" + std::to_string(cli.id));
  std::printf("job %lld %s\n", r["id"].get<long long>(), r["state"].get<std::string>().c_str());
  return 0;
}

}  // namespace

bool SchedulerCli::selected() const {
  return (serve && *serve) || (submit && (*submit || *status || *logs || *cancel)) ||
         (register_cluster && (*register_cluster || *link));
}

void add_scheduler_commands(CLI::App& app, SchedulerCli& cli) {
  cli.serve = app.add_subcommand("scheduler", "the compute-network scheduler daemon: jobs in SQLite, an HTTP/JSON API");
  cli.serve->add_option("--state", cli.state, "SQLite file holding every job (created; a restart recovers it)");
  cli.serve->add_option("--clusters", cli.clusters, "cluster file: clusters, devices, prices, links");
  cli.serve->add_option("--host", cli.host, "address to listen on");
  cli.serve->add_option("--port", cli.port, "port of the API (0: any free one)");
  cli.serve->add_option("--tick-ms", cli.tick_ms, "milliseconds between scheduling passes (default 100 for sim, else 1000)");
  cli.serve->add_option("--executor", cli.executor, "what runs the ranks: sim (nothing: a simulation on the wall "
                        "clock), local (processes on this machine) or slurm (sbatch on each cluster)")
      ->capture_default_str();
  cli.serve->add_option("--slurm", cli.slurm, "NAME=SLURM_CONF[:PARTITION]: how to reach cluster NAME (repeat per cluster)");
  cli.serve->add_option("--work-dir", cli.work_dir, "jobs' folders: scripts, output, run folders (default: jobs/ beside --state)");
  cli.serve->add_option("--ledger", cli.ledger, "recipe jobs' clusters sign what they trained into this ledger");
  cli.serve->add_option("--ledger-keys", cli.ledger_keys, "folder of the clusters' keys (NAME.key, keys.json)");
  cli.serve->add_option("--ledger-url", cli.ledger_url,
                        "this scheduler's address as the clusters reach it (http[s]://ADDRESS:PORT): their shares "
                        "claim over the API (POST /api/ledger, signed) instead of writing the --ledger file, for "
                        "clusters that do not share this machine's disk");
  cli.serve->add_option("--ledger-ca", cli.ledger_ca,
                        "with an https --ledger-url: the certificate (PEM) the shares trust, as a path on the clusters");
  cli.serve->add_option("--claim-every-s", cli.claim_every_s, "seconds between a training share's ledger claims")
      ->capture_default_str()->check(CLI::PositiveNumber);
  cli.serve->add_option("--master-host", cli.master_host, "address at which the shares of a job reach its first share")
      ->capture_default_str();
  cli.serve->add_option("--tokens", cli.tokens, "API tokens file, ROLE TOKEN per line (default: STATE.tokens, made "
                        "with a fresh admin and read token on the first start)");
  cli.serve->add_option("--cluster-keys", cli.cluster_keys, "the clusters' public keys (keys.json of crosstrain ledger "
                        "keygen): registrations and link reports must be signed by the cluster (default: "
                        "--ledger-keys/keys.json)");
  cli.serve->add_option("--tls-cert", cli.tls_cert, "serve HTTPS with this PEM certificate (needed beyond loopback)");
  cli.serve->add_option("--tls-key", cli.tls_key, "the certificate's PEM private key");
  cli.serve->add_option("--max-local-ranks", cli.max_local_ranks,
                        "--executor local: the most ranks one job may start on this machine (0: two per core)")
      ->check(CLI::NonNegativeNumber);
  cli.serve->add_option("--cluster-host", cli.cluster_hosts, "CLUSTER=ADDRESS: where that cluster's share nodes "
                        "are reached (a job's rendezvous is on its first share's cluster; default --master-host)");
  cli.serve->add_option("--quota", cli.quotas, "USER=DEVICES: the most devices one user's jobs hold at once "
                        "(repeat for each user; users not named have no limit)");
  cli.serve->add_flag("--no-preemption", cli.no_preemption,
                      "a job of higher priority waits instead of preempting running jobs of lower priority");
  cli.serve->add_option("--move-after-s", cli.move_after_s,
                        "a live-elastic job's share whose cluster has been down this long grows onto another cluster "
                        "of the same device with room (a new one, or a free one); negative: it waits for its own")
      ->capture_default_str();
  cli.serve->add_flag("--site-storage", cli.site_storage,
                      "each cluster has storage of its own, shared with no other: a share's run folder is "
                      "WORK/sites/CLUSTER/jobID/run and every checkpoint is committed whole at every site (run.site)");
  auto client_options = [&cli](CLI::App* c) {
    c->add_option("--token", cli.token, "API token (else CROSSTRAIN_SCHEDULER_TOKEN, else --token-file)");
    c->add_option("--token-file", cli.token_file, "the daemon's tokens file (its admin token is used)");
    c->add_option("--ca-cert", cli.ca_cert, "PEM certificate that signed an https --server's own");
  };
  auto* job = app.add_subcommand("job", "submit, watch and cancel jobs of a running scheduler");
  job->require_subcommand(1);
  job->add_option("--server", cli.server, "the scheduler's address")->capture_default_str();
  client_options(job);
  cli.submit = job->add_subcommand("submit", "queue a job");
  cli.submit->add_option("--spec", cli.spec, "a JSON job spec (else the options below)");
  cli.submit->add_option("--name", cli.name, "job name");
  cli.submit->add_option("--model", cli.model, "a model preset (crosstrain plan --help lists them)");
  cli.submit->add_option("--ranks", cli.ranks, "devices, started together");
  cli.submit->add_option("--steps", cli.steps, "training steps (default: the recipe's, else 1000)");
  cli.submit->add_option("--recipe", cli.recipe, "a training recipe the ranks run (crosstrain train RECIPE)");
  cli.submit->add_option("--set", cli.sets, "KEY=VALUE override of the recipe (repeatable)");
  cli.submit->add_option("--min-ranks", cli.min_ranks, "elastic: may start or continue on as few ranks as this");
  cli.submit->add_option("--max-restarts", cli.max_restarts, "place a failed gang again from its checkpoint this many times");
  cli.submit->add_option("--user", cli.user, "who the job is for: quotas and accounting are per user")->capture_default_str();
  cli.submit->add_option("--priority", cli.priority, "higher is placed first and may preempt lower (-1000..1000)")
      ->capture_default_str();
  cli.submit->add_option("--global-batch", cli.global_batch, "sequences per step (default: the recipe's, else ranks)");
  cli.submit->add_option("--checkpoint-every", cli.checkpoint_every, "steps between checkpoints (where a re-placed job resumes)");
  cli.submit->add_option("--deadline-s", cli.deadline_s, "QoS: finish within this many seconds");
  cli.submit->add_option("--budget", cli.budget, "QoS: most the run may cost");
  cli.submit->add_option("--max-wan-gbps", cli.max_wan_gbps, "QoS: most wide-area bandwidth (0: one cluster only)");
  cli.status = job->add_subcommand("status", "every job, or one");
  cli.status->add_option("id", cli.id, "job id");
  cli.logs = job->add_subcommand("logs", "a job's events: submitted, placed, started, re-placed, ended");
  cli.logs->add_option("id", cli.id, "job id")->required();
  cli.cancel = job->add_subcommand("cancel", "stop a job wherever it runs");
  cli.cancel->add_option("id", cli.id, "job id")->required();
  auto* cluster = app.add_subcommand("cluster", "clusters joining a running scheduler, and measured links");
  cluster->require_subcommand(1);
  cluster->add_option("--server", cli.server, "the scheduler's address")->capture_default_str();
  client_options(cluster);
  cluster->add_option("--key", cli.key, "this cluster's key (NAME.key of crosstrain ledger keygen): signs the request");
  cli.register_cluster = cluster->add_subcommand("register", "a cluster joins the pool (or comes back after a loss)");
  cli.register_cluster->add_option("file", cli.cluster_file, "cluster file holding this cluster alone (clusters/*.toml format)")
      ->required();
  cli.link = cluster->add_subcommand("link", "record a measured wide-area link between two clusters");
  cli.link->add_option("a", cli.link_a, "cluster")->required();
  cli.link->add_option("b", cli.link_b, "cluster")->required();
  cli.link->add_option("--bandwidth-gbps", cli.bandwidth_gbps, "measured bandwidth, Gbit/s")->required()
      ->check(CLI::PositiveNumber);
  cli.link->add_option("--latency-us", cli.latency_us, "measured latency, microseconds")->check(CLI::NonNegativeNumber);
}

int run_scheduler_command(const SchedulerCli& cli) {
  if (*cli.serve) return serve(cli);
  return client_command(cli);
}

}  // namespace crosstrain::apps
