// The compute network end to end (issues 19 and 35), as a user runs it: three real Slurm clusters started by the
// test (scripts/slurm_testbed.sh), each inside its own host of the emulated testbed (scripts/testbed: network
// namespaces joined by shaped wide-area links with a one-way delay), the scheduler daemon on this machine reaching
// them over the testbed's uplink (`crosstrain scheduler --executor slurm --site-storage`: each cluster has storage
// of its own), and one recipe job submitted with `crosstrain job submit`. The job is placed across the three
// clusters in DiLoCo mode and trains for real (gpt-tiny, ranks as processes under each cluster's slurmd, their
// traffic between clusters over the emulated links). Mid-run west loses power (controller, node daemon and job
// steps killed): the scheduler notices and the job goes on with east and north, live (elastic DiLoCo: no process of
// theirs restarts, no step is repeated). The daemon itself is killed (SIGKILL) and restarted on the same state file;
// the dashboard is rendered in headless Chromium. West's power returns and it registers again: the job grows back
// onto it at a join generation, and ends with its final checkpoint whole at every site. Needs root (slurmd,
// namespaces), slurm-wlm, munge, iproute2 and chromium.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "chromium.h"
#include "crosstrain/scheduler/api_auth.h"
#include "crosstrain/scheduler/train_share.h"
#include "crosstrain/train/checkpoint_sites.h"
#include "subprocess.h"
#include "scratch.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using nlohmann::json;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kTestbed = CT_SOURCE_DIR "/scripts/slurm_testbed.sh";
const std::string kRecipe = CT_SOURCE_DIR "/recipes/gpt-tiny.toml";
const std::string kNetTestbed = CT_SOURCE_DIR "/scripts/testbed";
const std::vector<std::string> kClusters{"east", "west", "north"};  // testbed clusters 0, 1, 2
constexpr const char* kUplink = "10.79.0.1";  // this machine, as the testbed's hosts reach it (testbed up --uplink)
int devices(const std::string& cluster) { return cluster == "east" ? 2 : 1; }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Three clusters of one node each, east's with 2 CPUs ("2 devices"), west's and north's with 1, joined by slow
// wide-area links: a 4-rank job must span all three in uneven shares, and across 100 Mbit/s DiLoCo beats a
// synchronous all-reduce of every step. (bf16 is slower than fp32 on these CPUs.)
void write_cluster_file(const fs::path& path, const std::vector<std::string>& names = kClusters) {
  std::ofstream out(path);
  out << "name = \"three-slurm-clusters\"\n[devices.cpu]\npeak_tflops = { fp32 = 0.05, bf16 = 0.02 }\nmemory_gb = 8\n"
         "memory_bandwidth_gbs = 20\npower_w = 15\ngemm_efficiency = 0.5\nprice_per_hour = 0.1\n";
  for (const std::string& name : names)
    out << "[[clusters]]\nname = \"" << name << "\"\ndevice = \"cpu\"\nhosts = 1\ndevices_per_host = " << devices(name) << "\n"
        << "[clusters.links.host]\nlatency_us = 5\nbandwidth_gbps = 40\n"
        << "[clusters.links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n";
  if (names.size() > 1) out << "[links.wan]\nlatency_us = 10000\nbandwidth_gbps = 0.1\n";
}

class ComputeNetwork : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run slurmd and network namespaces";
    root_ = crosstrain::testing::scratch_dir("network");
    // The sites: one host each in the testbed's clusters 0, 1 and 2, 100 Mbit/s and 10 ms apart; this machine (the
    // daemon, the test) reaches them over the uplink as a remote site would.
    testbed_ = "ctn" + std::to_string(::getpid());
    const auto up = run_process({kNetTestbed, "up", "--name", testbed_, "--clusters", std::to_string(kClusters.size()),
                                 "--hosts-per-cluster", "1", "--wan-rate", "100mbit", "--wan-delay-ms", "10", "--uplink",
                                 "--relay", (fs::path(kBin).parent_path() / "crosstrain-delay-relay").string()},
                                {}, milliseconds(60000));
    ASSERT_EQ(up.exit_code(), 0) << up.output;
    make_certificate();
    for (const std::string& name : kClusters) start_cluster(name);
    write_cluster_file(root_ / "clusters.toml");
    for (const char* name : {"east", "west", "north", "mallory"}) {
      const auto r = run_process({kBin, "ledger", "keygen", "--cluster", name, "--out", (root_ / "keys").string()});
      ASSERT_EQ(r.exit_code(), 0) << r.output;
    }
    api_port_ = free_port();
  }
  void TearDown() override {
    if (daemon_) daemon_->signal(SIGKILL), daemon_->wait(milliseconds(5000));
    for (const std::string& name : kClusters)
      run_process({kTestbed, "stop", (root_ / name).string()}, {}, milliseconds(30000));
    if (!testbed_.empty()) run_process({kNetTestbed, "down", testbed_}, {}, milliseconds(60000));
    if (!HasFailure()) fs::remove_all(root_);
    else std::fprintf(stderr, "kept %s for a look\n", root_.c_str());
  }
  static int index_of(const std::string& name) {
    return static_cast<int>(std::find(kClusters.begin(), kClusters.end(), name) - kClusters.begin());
  }
  static int port(const std::string& name) { return 23000 + (::getpid() % 400) * 20 + 5 * index_of(name); }
  static std::string address(const std::string& name) { return "10.77." + std::to_string(index_of(name)) + ".1"; }
  // The cluster's Slurm in its testbed host (controller and node on its address; its jobs' processes there too).
  // No disk shared with this machine: its node and jobs see nothing of the test's folder but the cluster's own
  // (its Slurm, its site's storage) and the keys folder (its key, the clusters' public keys, the daemon's
  // certificate; a real site keeps its own copy).
  void start_cluster(const std::string& name) {
    const std::string keep = (root_ / name).string() + "," +
                             crosstrain::scheduler::site_dir_of((root_ / "jobs").string(), name) + "," +
                             (root_ / "keys").string();
    const auto r = run_process({kTestbed, "start", (root_ / name).string(), name, std::to_string(port(name)), std::to_string(devices(name)),
                                "--testbed", testbed_, "c" + std::to_string(index_of(name)) + "-h0", "--private",
                                root_.string(), keep},
                               {}, milliseconds(60000));
    ASSERT_EQ(r.exit_code(), 0) << r.output;
  }
  std::string wan_bytes() const {
    return run_process({kNetTestbed, "wan-bytes", testbed_}, {}, milliseconds(10000)).output;
  }

  void start_daemon() {
    std::vector<std::string> daemon_args({
        kBin, "scheduler", "--state", (root_ / "state.db").string(), "--clusters", (root_ / "clusters.toml").string(),
        "--port", std::to_string(api_port_), "--executor", "slurm", "--work-dir", (root_ / "jobs").string(),
        "--tick-ms", "500", "--ledger", ledger(), "--ledger-keys", (root_ / "keys").string(), "--claim-every-s", "1",
        "--site-storage", "--host", "0.0.0.0", "--tls-cert", ca(), "--tls-key", (root_ / "tls" / "key.pem").string(),
        "--ledger-url", "https://" + std::string(kUplink) + ":" + std::to_string(api_port_), "--ledger-ca", ca()});
    for (const std::string& name : kClusters)
      daemon_args.insert(daemon_args.end(), {"--slurm", name + "=" + (root_ / name / "slurm.conf").string(),
                                             "--cluster-host", name + "=" + address(name)});
    daemon_ = std::make_unique<Process>(daemon_args);
    ASSERT_TRUE(daemon_->wait_for_output("/api (Ctrl-C", milliseconds(30000)));
  }
  void kill_daemon() {
    daemon_->signal(SIGKILL);
    daemon_->wait(milliseconds(5000));
    daemon_.reset();
  }
  ProcessResult job(std::vector<std::string> args) {
    std::vector<std::string> argv{kBin, "job", "--server", server(), "--ca-cert", ca(), "--token-file", tokens_file()};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, {}, milliseconds(30000));
  }
  // The API's view of job 1 ({} while the daemon does not answer).
  json job1() {
    const auto c = client();
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(15, 0);
    const auto r = c->Get("/api/jobs/1", httplib::Headers{{"Authorization", "Bearer " + token(crosstrain::scheduler::ApiRole::Read)}});
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json::object();
  }
  // The daemon's certificate: the clusters reach its API over the network (the ledger), so it serves HTTPS.
  void make_certificate() {
    fs::create_directories(root_ / "tls");
    fs::create_directories(root_ / "keys");
    const auto cert = run_process({"openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
                                   "-nodes", "-keyout", (root_ / "tls" / "key.pem").string(), "-out", ca(), "-days", "2",
                                   "-subj", "/CN=crosstrain-test", "-addext",
                                   "subjectAltName=IP:127.0.0.1,IP:" + std::string(kUplink)},
                                  {}, milliseconds(30000));
    ASSERT_EQ(cert.exit_code(), 0) << cert.output;
  }
  // What share `share` of job 1 printed, on its cluster's own storage (every Slurm job of it, oldest first).
  std::string share_output(const std::string& cluster, int share) const {
    std::vector<fs::path> outs;
    std::error_code ec;
    const std::string prefix = "job1-share" + std::to_string(share) + "-";
    for (const auto& e : fs::directory_iterator(crosstrain::scheduler::site_dir_of((root_ / "jobs").string(), cluster), ec))
      if (e.path().filename().string().rfind(prefix, 0) == 0) outs.push_back(e.path());
    std::sort(outs.begin(), outs.end(), [](const fs::path& a, const fs::path& b) {
      const auto id = [](const fs::path& p) { return std::stoll(p.stem().string().substr(p.stem().string().rfind('-') + 1)); };
      return id(a) < id(b);
    });
    std::string text;
    for (const auto& p : outs) text += slurp(p);
    // Without --site-storage: the daemon's job folder.
    return outs.empty() ? slurp(root_ / "jobs" / "job1" / ("share" + std::to_string(share) + ".out")) : text;
  }
  std::string server() const { return "https://127.0.0.1:" + std::to_string(api_port_); }
  std::string url() const { return server() + "/"; }
  std::string ca() const { return (root_ / "keys" / "api.pem").string(); }
  std::unique_ptr<httplib::SSLClient> client() const {
    auto c = std::make_unique<httplib::SSLClient>("127.0.0.1", api_port_);
    c->set_ca_cert_path(ca().c_str());
    c->enable_server_certificate_verification(true);
    return c;
  }
  // The daemon's tokens file (made beside its state on the first start) and a token of `role` from it.
  std::string tokens_file() const { return (root_ / "state.db.tokens").string(); }
  std::string token(crosstrain::scheduler::ApiRole role) const {
    return crosstrain::scheduler::ApiTokens::load(tokens_file()).token(role);
  }
  // Polls job 1 until `done` holds of it (or the deadline passes); returns the last view.
  json wait_job(const std::function<bool(const json&)>& done, seconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    json j = job1();
    while (!(j.is_object() && j.contains("state") && done(j)) && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(500));
      j = job1();
    }
    return j;
  }
  std::string ledger() const { return (root_ / "ledger.jsonl").string(); }
  ProcessResult ledger_cmd(std::vector<std::string> args) {
    std::vector<std::string> argv{kBin, "ledger"};
    argv.insert(argv.end(), args.begin(), args.end());
    return run_process(argv, {}, milliseconds(60000));
  }
  std::string run_dir() const { return crosstrain::scheduler::job_run_dir((root_ / "jobs").string(), 1); }
  // Kills a cluster as a power cut would: controller first (so it stops answering), then the node daemon and the
  // job steps with their ranks; no job is cancelled through Slurm.
  void cut_power(const std::string& name) {
    const auto r = run_process({kTestbed, "kill", (root_ / name).string()}, {}, milliseconds(30000));
    ASSERT_EQ(r.exit_code(), 0) << r.output;
  }
  static std::string shares(const json& j) {
    std::string s;
    if (j.contains("placement") && j["placement"].is_object())
      for (const auto& sh : j["placement"]["shares"])
        s += (s.empty() ? "" : " + ") + std::string(sh.value("absent", false) ? "(absent) " : "") +
             sh["cluster"].get<std::string>() + ":" + std::to_string(sh["ranks"].get<int>());
    return s;
  }
  // Power back on: the cluster's Slurm starts again and it registers with the daemon (signed with its key).
  void power_on(const std::string& name) {
    start_cluster(name);
    write_cluster_file(root_ / (name + ".toml"), {name});
    const auto reg = run_process({kBin, "cluster", "--server", server(), "--ca-cert", ca(), "--token-file", tokens_file(), "--key", (root_ / "keys" / (name + ".key")).string(),
                                  "register", (root_ / (name + ".toml")).string()},
                                 {}, milliseconds(30000));
    ASSERT_EQ(reg.exit_code(), 0) << reg.output;
  }

  void check_the_ledger();

  fs::path root_;
  std::string testbed_;
  int api_port_ = 0;
  std::unique_ptr<Process> daemon_;
};

}  // namespace

// The clusters signed what they trained as they went: the ledger verifies, with each cluster's work in it; a contributor
// that claims work it did not do is flagged by the spot check (the honest clusters are not); a tampered copy of
// the ledger is refused.
void ComputeNetwork::check_the_ledger() {
  const std::string keys = (root_ / "keys" / "keys.json").string();
  const auto verified = ledger_cmd({"verify", ledger(), "--keys", keys});
  ASSERT_EQ(verified.exit_code(), 0) << verified.output;
  // Every cluster signed its own work, read at its own site (no run folder is shared).
  for (const std::string& name : kClusters) EXPECT_TRUE(contains(verified.output, "\n" + name + " ")) << verified.output;
  std::ifstream in(ledger());
  std::string first;
  std::getline(in, first);
  const json entry = json::parse(first);
  const double flops_per_token = entry["flops"].get<double>() / entry["tokens"].get<double>();
  // One placement: the job shrank and grew back instead of being placed again.
  auto spot_check = [&](const std::string& job) {
    return ledger_cmd({"spot-check", ledger(), "--keys", keys, "--job", job, "--tokens-per-step", "1536",
                       "--flops-per-token", std::to_string(flops_per_token)});
  };
  for (const char* attempt : {"tiny-1.a1"}) {
    const auto honest = spot_check(attempt);
    EXPECT_EQ(honest.exit_code(), 0) << "the honest clusters' claims of " << attempt << " hold: " << honest.output;
  }
  // Mallory claims 50 steps it never computed, at 4x a step's tokens (12 sequences of 128).
  const auto faked = ledger_cmd({"append", ledger(), "--cluster", "mallory", "--key", (root_ / "keys" / "mallory.key").string(),
                                 "--job", "tiny-1.a1", "--first-step", "301", "--steps", "50", "--tokens", "307200",
                                 "--flops", std::to_string(307200 * flops_per_token), "--bytes", "0"});
  ASSERT_EQ(faked.exit_code(), 0) << faked.output;
  const auto caught = spot_check("tiny-1.a1");
  EXPECT_EQ(caught.exit_code(), 3) << caught.output;
  EXPECT_TRUE(contains(caught.output, "FLAG cluster mallory")) << caught.output;
  for (const std::string& name : kClusters)
    EXPECT_FALSE(contains(caught.output, "FLAG cluster " + name)) << caught.output;
  std::printf("%s%s", verified.output.c_str(), caught.output.c_str());
  // One number changed in a copy: verify refuses it, naming the line.
  std::string text = slurp(ledger());
  text.insert(text.find("\"steps\":") + 8, "1");
  std::ofstream(root_ / "tampered.jsonl") << text;
  const auto tampered = ledger_cmd({"verify", (root_ / "tampered.jsonl").string(), "--keys", keys});
  EXPECT_EQ(tampered.exit_code(), 1) << tampered.output;
  EXPECT_TRUE(contains(tampered.output, "line 1")) << tampered.output;
}

TEST_F(ComputeNetwork, ADiLoCoJobAcrossThreeSlurmClustersOnEmulatedLinksShrinksAndGrowsLiveAndSurvivesADaemonRestart) {
  start_daemon();
  const auto submitted = job({"submit", "--recipe", kRecipe, "--name", "tiny", "--ranks", "4", "--min-ranks", "2", "--global-batch", "12",
                              "--steps", "500", "--checkpoint-every", "50", "--set", "sync.inner_steps=5", "--set",
                              "train.eval_every=0", "--set", "train.sample_tokens=0", "--set", "run.log_every=10",
                              "--set", "train.warmup_steps=5", "--set", "comm.timeout_s=60",
                              // Four ranks, three Slurm clusters and the daemon share 2 cores, and a checkpoint's
                              // staging fills the wide-area links (heartbeats queue behind it): 500 ms without a
                              // heartbeat happens, and would exclude a healthy cluster.
                              "--set", "elastic.failure_timeout_ms=10000"});
  ASSERT_EQ(submitted.exit_code(), 0) << submitted.output;
  ASSERT_TRUE(contains(submitted.output, "job 1 queued")) << submitted.output;

  // 1. Placed across the three clusters in DiLoCo mode, in uneven shares, and training: checkpoints appear in its run folder.
  json j = wait_job([](const json& v) { return v["state"] == "running"; }, seconds(60));
  ASSERT_EQ(j.value("state", ""), "running") << j.dump();
  EXPECT_EQ(shares(j), "east:2 + west:1 + north:1") << j.dump();
  EXPECT_EQ(j["placement"]["sync"], "diloco") << j.dump();
  const auto until = std::chrono::steady_clock::now() + seconds(150);
  while (crosstrain::scheduler::newest_checkpoint_step(run_dir()) < 20 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(milliseconds(300));
  const int64_t before_loss = crosstrain::scheduler::newest_checkpoint_step(run_dir());
  ASSERT_GE(before_loss, 20) << "no checkpoint from the gang; share output:\n"
                             << share_output("east", 0) << share_output("west", 1);

  std::printf("west's power cut at step %lld's checkpoint\n", static_cast<long long>(before_loss));
  // 2. West dies mid-run: the job goes on with east and north, without restarting their processes and without
  // repeating a step (elastic DiLoCo across clusters), and holds none of west's devices.
  const std::string east_group = slurp(root_ / "jobs" / "job1" / "share0.slurm");
  const std::string north_group = slurp(root_ / "jobs" / "job1" / "share2.slurm");
  const int64_t step_at_loss = crosstrain::scheduler::last_metrics_step(run_dir());
  cut_power("west");
  j = wait_job([](const json& v) { return shares(v) == "east:2 + (absent) west:1 + north:1"; }, seconds(90));
  ASSERT_EQ(shares(j), "east:2 + (absent) west:1 + north:1") << j.dump();
  EXPECT_EQ(j.value("state", ""), "running") << j.dump();
  EXPECT_EQ(j.value("attempts", 0), 1) << "re-placed instead of going on: " << j.dump();
  const auto shrunk_until = std::chrono::steady_clock::now() + seconds(60);
  while (crosstrain::scheduler::last_metrics_step(run_dir()) < step_at_loss + 20 &&
         std::chrono::steady_clock::now() < shrunk_until)
    std::this_thread::sleep_for(milliseconds(300));
  ASSERT_GE(crosstrain::scheduler::last_metrics_step(run_dir()), step_at_loss + 20) << "the job did not go on without west";
  const auto logs = job({"logs", "1"});
  EXPECT_TRUE(contains(logs.output, "cluster west lost")) << logs.output;
  EXPECT_TRUE(contains(logs.output, "shrunk")) << logs.output;

  // 3. The daemon is killed mid-run and restarted: the job is still there, still running, west still absent.
  kill_daemon();
  std::this_thread::sleep_for(seconds(2));
  start_daemon();
  const auto after = job({"status", "1"});
  ASSERT_EQ(after.exit_code(), 0) << after.output;
  EXPECT_TRUE(contains(after.output, "tiny")) << after.output;
  EXPECT_FALSE(contains(after.output, "queued") || contains(after.output, "failed")) << "no job was lost: " << after.output;
  // The dashboard of the restarted daemon: west lost, the job on east, its live metrics from the run folder.
  const std::string dom = chromium_dom(url() + "#token=" + token(crosstrain::scheduler::ApiRole::Read) + "&job=1", root_ / "browser");
  for (const char* text : {"data-status=\"ok\"", "east", "west", "lost", "tiny", "state-running", "east:2",
                           "absent", "shrunk", "id=\"m-step\""})
    EXPECT_TRUE(contains(dom, text)) << "the dashboard lacks '" << text << "'";
  std::smatch shown;
  ASSERT_TRUE(std::regex_search(dom, shown, std::regex("id=\"m-step\">(\\d+)<"))) << "no live step on the dashboard";
  EXPECT_GT(std::stoll(shown[1]), before_loss) << "the live metrics are the running job's";

  // 4. West's power comes back and it registers: the job grows onto it, into the running training.
  power_on("west");
  const auto up_at = std::chrono::steady_clock::now();
  j = wait_job([](const json& v) { return shares(v) == "east:2 + west:1 + north:1"; }, seconds(60));
  ASSERT_EQ(shares(j), "east:2 + west:1 + north:1") << j.dump();
  // A join generation of both replicas after the failure generation that went on without west.
  auto rejoined = [&] {
    const std::string out = share_output("east", 0);
    const auto failure = out.find("(failure): 2 replicas");
    return failure != std::string::npos && out.find("(join): 3 replicas", failure) != std::string::npos;
  };
  const auto joined_until = std::chrono::steady_clock::now() + seconds(120);
  while (!rejoined() && std::chrono::steady_clock::now() < joined_until) std::this_thread::sleep_for(milliseconds(300));
  ASSERT_TRUE(rejoined()) << share_output("east", 0) << share_output("west", 1);
  std::printf("west rejoined the running job %.1f s after it registered again\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - up_at).count());

  // 5. The job ends done at step 500 in its first placement, east's and north's shares never restarted, every step
  // once, and the final checkpoint whole at every site (no run folder is shared).
  j = wait_job([](const json& v) { return v["state"] == "done" || v["state"] == "failed"; }, seconds(300));
  ASSERT_EQ(j.value("state", ""), "done") << j.dump() << "\n" << share_output("east", 0);
  EXPECT_EQ(j.value("step", int64_t{0}), 500);
  EXPECT_EQ(j.value("attempts", 0), 1);
  EXPECT_EQ(slurp(root_ / "jobs" / "job1" / "share0.slurm"), east_group) << "east's share was started again";
  EXPECT_EQ(slurp(root_ / "jobs" / "job1" / "share2.slurm"), north_group) << "north's share was started again";
  for (const std::string& site : kClusters)
    EXPECT_EQ(crosstrain::scheduler::newest_checkpoint_step(
                  crosstrain::scheduler::site_run_dir((root_ / "jobs").string(), site, 1)),
              500)
        << site << " lacks the final checkpoint";
  // The run's metrics followed the checkpoints: every site holds share 0's metrics.jsonl, the same bytes.
  const std::string metrics_sum = crosstrain::train::file_checksum((fs::path(run_dir()) / "metrics.jsonl").string());
  for (const std::string& site : kClusters)
    EXPECT_EQ(crosstrain::train::file_checksum(
                  (fs::path(crosstrain::scheduler::site_run_dir((root_ / "jobs").string(), site, 1)) / "metrics.jsonl")
                      .string()),
              metrics_sum)
        << site << "'s copy of the metrics";
  std::vector<int64_t> steps;
  std::ifstream metrics(fs::path(run_dir()) / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) steps.push_back(json::parse(line)["step"].get<int64_t>());
  ASSERT_EQ(steps.size(), 500u);
  for (size_t i = 0; i < steps.size(); ++i) ASSERT_EQ(steps[i], static_cast<int64_t>(i + 1)) << "a step repeated or lost";
  // The accounting: what each cluster signed in the ledger, for the job's user, beside the device-hours.
  {
    const auto c = client();
    c->set_read_timeout(30, 0);
    const auto r = c->Get("/api/usage", httplib::Headers{{"Authorization", "Bearer " + token(crosstrain::scheduler::ApiRole::Read)}});
    ASSERT_TRUE(r && r->status == 200);
    const json rows = json::parse(r->body);
    for (const std::string& name : kClusters) {
      bool found = false;
      for (const auto& row : rows)
        if (row["cluster"] == name && row["user"] == j["user"]) {
          found = true;
          EXPECT_GT(row["tokens"].get<int64_t>(), 0) << row.dump();
          EXPECT_EQ(row["ledger"], "verified") << row.dump();
        }
      EXPECT_TRUE(found) << name << " has no usage: " << rows.dump();
    }
  }
  check_the_ledger();
  // The timeline, for the record (docs/scheduler.md quotes it).
  std::printf("checkpoint before the loss: step %lld\nbytes across the wide-area links: %s%s",
              static_cast<long long>(before_loss), wan_bytes().c_str(), job({"logs", "1"}).output.c_str());
}

namespace {

// One Slurm cluster of two nodes, each in its own host of the testbed (one CPU each): a job of two ranks is one
// share over both nodes.
class MultiNodeShare : public ComputeNetwork {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run slurmd and network namespaces";
    root_ = crosstrain::testing::scratch_dir("multinode");
    testbed_ = "cmn" + std::to_string(::getpid());
    const auto up = run_process({kNetTestbed, "up", "--name", testbed_, "--clusters", "1", "--hosts-per-cluster", "2",
                                 "--wan-delay-ms", "0", "--uplink", "--relay",
                                 (fs::path(kBin).parent_path() / "crosstrain-delay-relay").string()},
                                {}, milliseconds(60000));
    ASSERT_EQ(up.exit_code(), 0) << up.output;
    const auto slurm = run_process({kTestbed, "start", (root_ / "east").string(), "east", std::to_string(port("east")),
                                    "1", "--testbed", testbed_, "c0-h0,c0-h1"},
                                   {}, milliseconds(60000));
    ASSERT_EQ(slurm.exit_code(), 0) << slurm.output;
    std::ofstream out(root_ / "clusters.toml");
    out << "name = \"one-cluster-two-nodes\"\n[devices.cpu]\npeak_tflops = { fp32 = 0.05, bf16 = 0.02 }\n"
           "memory_gb = 8\nmemory_bandwidth_gbs = 20\npower_w = 15\ngemm_efficiency = 0.5\nprice_per_hour = 0.1\n"
           "[[clusters]]\nname = \"east\"\ndevice = \"cpu\"\nhosts = 2\ndevices_per_host = 1\n"
           "[clusters.links.host]\nlatency_us = 5\nbandwidth_gbps = 40\n"
           "[clusters.links.cluster]\nlatency_us = 20\nbandwidth_gbps = 10\n";
    out.close();
    api_port_ = free_port();
    make_certificate();
  }
};

}  // namespace

// The daemon places a 2-rank job on the cluster's two 1-CPU nodes: one batch job of two nodes, srun starts a
// launcher on each, the ranks meet at the cluster's address (--cluster-host) and train to the end. That address is
// the second node's (east-node1, 10.77.0.2), not the first one Slurm lists: the node there is the share's node 0.
TEST_F(MultiNodeShare, AJobLargerThanANodeRunsOverTwoNodesOfItsCluster) {
  daemon_ = std::make_unique<Process>(std::vector<std::string>{
      kBin, "scheduler", "--state", (root_ / "state.db").string(), "--clusters", (root_ / "clusters.toml").string(),
      "--port", std::to_string(api_port_), "--executor", "slurm", "--work-dir", (root_ / "jobs").string(), "--tick-ms",
      "500", "--slurm", "east=" + (root_ / "east" / "slurm.conf").string(), "--cluster-host", "east=10.77.0.2",
      "--tls-cert", ca(), "--tls-key", (root_ / "tls" / "key.pem").string()});
  ASSERT_TRUE(daemon_->wait_for_output("/api (Ctrl-C", milliseconds(30000)));
  const auto submitted = job({"submit", "--recipe", kRecipe, "--name", "wide", "--ranks", "2", "--global-batch", "4",
                              "--steps", "20", "--checkpoint-every", "10", "--set", "train.eval_every=0", "--set",
                              "train.sample_tokens=0", "--set", "comm.timeout_s=60"});
  ASSERT_EQ(submitted.exit_code(), 0) << submitted.output;
  // While it runs, Slurm lists the share's batch job on both nodes.
  const std::string conf = "SLURM_CONF=" + (root_ / "east" / "slurm.conf").string();
  std::string node_list;
  const auto until = std::chrono::steady_clock::now() + seconds(120);
  while (node_list.find("east-node") == std::string::npos && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(300));
    node_list = run_process({"sh", "-c", conf + " squeue -h -o %N"}, {}, milliseconds(10000)).output;
  }
  EXPECT_EQ(node_list, "east-node[0-1]\n");
  const json j = wait_job([](const json& v) { return v["state"] == "done" || v["state"] == "failed"; }, seconds(240));
  const std::string out = share_output("east", 0);
  ASSERT_EQ(j.value("state", ""), "done") << j.dump() << "\n" << out;
  // Two launcher nodes (--nnodes 2): the job could only start once srun had started the second on node 1.
  const std::string script = slurp(root_ / "jobs" / "job1" / "share0.sh");
  EXPECT_TRUE(contains(script, "'srun' '--nodes=2'")) << script;
  EXPECT_TRUE(contains(script, "--nnodes")) << script;
  int64_t last = 0;
  std::ifstream metrics(crosstrain::scheduler::job_run_dir((root_ / "jobs").string(), 1) + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) last = json::parse(line)["step"].get<int64_t>();
  EXPECT_EQ(last, 20);
}
