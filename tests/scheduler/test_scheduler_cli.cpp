// The scheduler daemon and its clients as a user runs them: `crosstrain scheduler` (state in SQLite, HTTP/JSON
// API) and `crosstrain job submit|status|logs|cancel`, real processes. A job placed and running survives the
// daemon being killed (SIGKILL) and restarted on the same state file; a job that can never run is refused with
// the reason; errors name what is wrong. The executor is the wall-clock simulation (real clusters:
// test_slurm_executor.cpp).
#include <gtest/gtest.h>

#include <map>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <cstdlib>
#include <thread>

#include "chromium.h"
#include "crosstrain/scheduler/api_auth.h"
#include "subprocess.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kClusters = CT_SOURCE_DIR "/clusters/three-clusters.toml";

// The state file of the daemon on each port: its tokens file is beside it.
std::map<int, std::string>& states() {
  static std::map<int, std::string> by_port;
  return by_port;
}
std::string state_of_port(int port) { return states()[port]; }

std::unique_ptr<Process> start_daemon(const std::string& state, int port, std::vector<std::string> more = {}) {
  states()[port] = state;
  std::vector<std::string> argv{kBin, "scheduler", "--state", state, "--clusters", kClusters, "--port",
                                std::to_string(port)};
  argv.insert(argv.end(), more.begin(), more.end());
  auto p = std::make_unique<Process>(argv);
  EXPECT_TRUE(p->wait_for_output("/api (Ctrl-C", milliseconds(20000)));
  return p;
}

ProcessResult job(int port, std::vector<std::string> args) {
  std::vector<std::string> argv{kBin, "job", "--server", "http://127.0.0.1:" + std::to_string(port), "--token-file",
                                state_of_port(port) + ".tokens"};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, milliseconds(30000));
}

// `job status` once the job has left `state` (or 10 s passed).
ProcessResult status_after(int port, const std::string& state) {
  ProcessResult r = job(port, {"status", "1"});
  for (int i = 0; i < 100 && contains(r.output, state); ++i) {
    std::this_thread::sleep_for(milliseconds(100));
    r = job(port, {"status", "1"});
  }
  return r;
}

}  // namespace

TEST(SchedulerCli, ARunningJobSurvivesTheDaemonBeingKilledAndRestarted) {
  const fs::path dir = fs::path(::testing::TempDir()) / "ct-scheduler-cli";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string state = (dir / "state.db").string();
  const int port = free_port();
  auto daemon = start_daemon(state, port);

  auto submitted = job(port, {"submit", "--name", "long", "--model", "gpt3-175b", "--ranks", "64", "--steps", "100000"});
  ASSERT_EQ(submitted.exit_code(), 0) << submitted.output;
  EXPECT_TRUE(contains(submitted.output, "job 1 queued")) << submitted.output;
  auto never = job(port, {"submit", "--name", "never", "--model", "gpt-small", "--ranks", "100000"});
  EXPECT_EQ(never.exit_code(), 1);
  EXPECT_TRUE(contains(never.output, "job 2 failed: rejected: can never run here")) << never.output;
  auto running = status_after(port, "queued");
  ASSERT_TRUE(contains(running.output, "running")) << running.output;
  EXPECT_TRUE(contains(running.output, ":64")) << "placed on one cluster's 64 devices: " << running.output;

  daemon->signal(SIGKILL);
  daemon->wait(milliseconds(5000));
  auto down = job(port, {"status"});
  EXPECT_NE(down.exit_code(), 0);
  EXPECT_TRUE(contains(down.output, "no scheduler answers")) << down.output;

  daemon = start_daemon(state, port);
  auto after = job(port, {"status"});
  ASSERT_EQ(after.exit_code(), 0) << after.output;
  EXPECT_TRUE(contains(after.output, "long")) << after.output;
  EXPECT_TRUE(contains(after.output, "running")) << "no job was lost: " << after.output;
  EXPECT_TRUE(contains(after.output, "rejected")) << after.output;
  auto logs = job(port, {"logs", "1"});
  EXPECT_TRUE(contains(logs.output, "submitted") && contains(logs.output, "placed") && contains(logs.output, "started"))
      << logs.output;

  auto cancelled = job(port, {"cancel", "1"});
  EXPECT_TRUE(contains(cancelled.output, "job 1 cancelled")) << cancelled.output;
  auto missing = job(port, {"status", "7"});
  EXPECT_NE(missing.exit_code(), 0);
  EXPECT_TRUE(contains(missing.output, "no job 7")) << missing.output;
  daemon->signal(SIGINT);
  EXPECT_EQ(daemon->wait(milliseconds(10000)).exit_code(), 0);
  fs::remove_all(dir);
}

TEST(SchedulerCli, TheDashboardShowsClustersLinksJobsAndPlacementsInABrowser) {
  if (!fs::exists("/usr/bin/chromium")) GTEST_SKIP() << "chromium is absent (scripts/install-deps.sh installs it)";
  const fs::path dir = fs::path(::testing::TempDir()) / "ct-scheduler-dashboard";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int port = free_port();
  auto daemon = start_daemon((dir / "state.db").string(), port);
  ASSERT_EQ(job(port, {"submit", "--name", "llama-pretrain", "--model", "gpt3-175b", "--ranks", "64", "--steps", "100000"})
                .exit_code(), 0);
  ASSERT_EQ(job(port, {"submit", "--name", "too-big", "--model", "gpt-small", "--ranks", "5000"}).exit_code(), 1);
  status_after(port, "queued");
  // Without a token the page shows nothing of the jobs (the API answers 401).
  const std::string base = "http://127.0.0.1:" + std::to_string(port) + "/";
  EXPECT_FALSE(contains(chromium_dom(base, dir / "browser-anonymous"), "llama-pretrain"));
  const std::string url = base + "#token=" + crosstrain::scheduler::ApiTokens::load(state_of_port(port) + ".tokens")
                                                 .token(crosstrain::scheduler::ApiRole::Read);
  const std::string dom = chromium_dom(url, dir / "browser");
  EXPECT_TRUE(contains(dom, "data-status=\"ok\"")) << dom.substr(0, 3000);
  for (const char* text : {"east", "west", "Gbit/s", "llama-pretrain", "state-running", "east:64", "too-big",
                           "rejected: can never run here", "submitted", "placed"})
    EXPECT_TRUE(contains(dom, text)) << "the dashboard lacks '" << text << "'";
  const std::string png = (dir / "dashboard.png").string();
  chromium_dom(url, dir / "browser-shot", png);
  EXPECT_GT(fs::exists(png) ? fs::file_size(png) : 0, 10000u) << "the screenshot is missing or empty";
  if (const char* keep = std::getenv("CT_DASHBOARD_PNG")) fs::copy_file(png, keep, fs::copy_options::overwrite_existing);
  daemon->signal(SIGINT);
  daemon->wait(milliseconds(10000));
  fs::remove_all(dir);
}

// The resource layer's registration through the CLI: a new cluster joins a running daemon, a second registration
// changes nothing, a measured link is recorded, and bad input is refused naming what is wrong.
TEST(SchedulerCli, ClustersRegisterWithARunningDaemonAndLinksAreRecorded) {
  const fs::path dir = fs::path(::testing::TempDir()) / "ct-scheduler-register";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int port = free_port();
  // Each cluster signs for itself with its ledger key; the daemon holds their public keys.
  for (const char* name : {"south", "east"})
    ASSERT_EQ(run_process({kBin, "ledger", "keygen", "--cluster", name, "--out", (dir / "keys").string()}, {},
                          milliseconds(30000)).exit_code(), 0);
  const std::vector<std::string> keys{"--cluster-keys", (dir / "keys" / "keys.json").string()};
  auto daemon = start_daemon((dir / "state.db").string(), port, keys);
  std::ofstream(dir / "south.toml") << R"(name = "south"
[devices.l4]
peak_tflops = { fp32 = 30, bf16 = 121 }
memory_gb = 24
memory_bandwidth_gbs = 300
power_w = 72
price_per_hour = 0.8
[[clusters]]
name = "south"
device = "l4"
hosts = 4
devices_per_host = 8
)";
  const std::string server = "http://127.0.0.1:" + std::to_string(port);
  auto cluster = [&](std::vector<std::string> args, const std::string& signer = "south") {
    std::vector<std::string> argv{kBin, "cluster", "--server", server};
    if (!signer.empty()) argv.insert(argv.end(), {"--key", (dir / "keys" / (signer + ".key")).string()});
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, {}, milliseconds(30000));
  };
  auto added = cluster({"register", (dir / "south.toml").string()});
  ASSERT_EQ(added.exit_code(), 0) << added.output;
  EXPECT_TRUE(contains(added.output, "cluster south added")) << added.output;
  EXPECT_TRUE(contains(cluster({"register", (dir / "south.toml").string()}).output, "cluster south unchanged"));
  auto link = cluster({"link", "east", "south", "--bandwidth-gbps", "2.5", "--latency-us", "40000"});
  ASSERT_EQ(link.exit_code(), 0) << link.output;
  EXPECT_TRUE(contains(link.output, "link east - south: 2.500 Gbit/s, 40000 us")) << link.output;
  // Unsigned, or signed by a cluster for another: refused, and nothing changes.
  auto unsigned_one = cluster({"register", (dir / "south.toml").string()}, "");
  EXPECT_NE(unsigned_one.exit_code(), 0);
  EXPECT_TRUE(contains(unsigned_one.output, "must be signed by the cluster")) << unsigned_one.output;
  auto for_another = cluster({"register", (dir / "south.toml").string()}, "east");
  EXPECT_NE(for_another.exit_code(), 0);
  EXPECT_TRUE(contains(for_another.output, "a cluster registers only itself")) << for_another.output;
  auto unknown = cluster({"link", "east", "nowhere", "--bandwidth-gbps", "1"}, "east");
  EXPECT_NE(unknown.exit_code(), 0);
  EXPECT_TRUE(contains(unknown.output, "nowhere")) << unknown.output;
  std::ofstream(dir / "bad.toml") << "name = \"x\"\n[[clusters]]\nname = \"x\"\ndevice = \"tpu9\"\nhosts = 1\n";
  auto bad = cluster({"register", (dir / "bad.toml").string()});
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_TRUE(contains(bad.output, "bad.toml")) << bad.output;
  // The daemon keeps them across a restart.
  daemon->signal(SIGKILL);
  daemon->wait(milliseconds(5000));
  daemon = start_daemon((dir / "state.db").string(), port, keys);
  EXPECT_TRUE(contains(cluster({"register", (dir / "south.toml").string()}).output, "cluster south unchanged"));
  daemon->signal(SIGINT);
  daemon->wait(milliseconds(10000));
  fs::remove_all(dir);
}

// A cluster that does not share the scheduler's disk claims its work over the API: `ledger claim URL` reads the
// chain (GET /api/ledger, signed with the cluster's key), seals after its head and sends each entry (POST). The
// entries land in the daemon's ledger file; again, nothing more is claimed; a cluster the daemon holds no key of is
// refused, and so is an unsigned read.
TEST(SchedulerCli, AClusterClaimsItsWorkIntoTheSchedulersLedgerOverTheApi) {
  const fs::path dir = fs::path(::testing::TempDir()) / "ct-scheduler-ledger-api";
  fs::remove_all(dir);
  fs::create_directories(dir / "run" / "work");
  for (const char* name : {"east", "west"})
    ASSERT_EQ(run_process({kBin, "ledger", "keygen", "--cluster", name, "--out", (dir / "keys").string()}, {},
                          milliseconds(30000)).exit_code(), 0);
  ASSERT_EQ(run_process({kBin, "ledger", "keygen", "--cluster", "mallory", "--out", (dir / "others").string()}, {},
                        milliseconds(30000)).exit_code(), 0);
  {
    std::ofstream log(dir / "run" / "work" / "east.a1.jsonl");
    for (int s = 1; s <= 4; ++s)
      log << "{\"step\":" << s << ",\"tokens\":100,\"bytes\":10,\"digest\":\"" << std::string(64, 'a' + s)
          << "\",\"time\":" << 1800000000 + s << "}\n";
  }
  const int port = free_port();
  const std::string ledger = (dir / "ledger.jsonl").string();
  auto daemon = start_daemon((dir / "state.db").string(), port,
                             {"--ledger", ledger, "--ledger-keys", (dir / "keys").string()});
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  auto claim = [&](const std::string& key) {
    return run_process({kBin, "ledger", "claim", url, "--run-dir", (dir / "run").string(), "--cluster",
                        fs::path(key).stem().string(), "--work-log", "east.a1", "--key", key, "--job", "j",
                        "--flops-per-token", "6"},
                       {}, milliseconds(30000));
  };
  const auto first = claim((dir / "keys" / "east.key").string());
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  EXPECT_TRUE(contains(first.output, "claimed steps 1-4 of job j for east: 400 tokens")) << first.output;
  EXPECT_TRUE(contains(claim((dir / "keys" / "east.key").string()).output, "nothing to claim"));
  const auto verified = run_process({kBin, "ledger", "verify", ledger, "--keys", (dir / "keys" / "keys.json").string()},
                                    {}, milliseconds(30000));
  EXPECT_EQ(verified.exit_code(), 0) << verified.output;
  EXPECT_TRUE(contains(verified.output, "1 entries")) << verified.output;
  const auto stranger = claim((dir / "others" / "mallory.key").string());
  EXPECT_NE(stranger.exit_code(), 0);
  EXPECT_TRUE(contains(stranger.output, "mallory")) << stranger.output;
  const auto unsigned_read = run_process({"curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", url + "/api/ledger"},
                                         {}, milliseconds(10000));
  EXPECT_EQ(unsigned_read.output, "401") << unsigned_read.output;
  daemon->signal(SIGINT);
  daemon->wait(milliseconds(10000));
  fs::remove_all(dir);
}
