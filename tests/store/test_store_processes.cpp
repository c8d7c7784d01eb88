// The rendezvous store hosted by a real launcher: hostile clients during a job's rendezvous, the address it
// listens on, a second job on the same port, and strangers that must give up within their timeout.
#include <gtest/gtest.h>
#include <signal.h>

#include <memory>

#include "store_probes.h"
#include "subprocess.h"

using namespace crosstrain::testing;
using std::chrono::milliseconds;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kWorker = CT_WORKER_BIN;

// Ranks that join a store someone else hosts.
std::map<std::string, std::string> rank_env(int rank, int world, int port, int timeout_ms) {
  return launched_rank_env(rank, world, port, timeout_ms, /*launcher_hosts_store=*/true);
}

// A launcher hosting the store of `nproc` ranks on 127.0.0.1:port, running `command`; returns once the store
// accepts connections.
std::unique_ptr<Process> start_job(int port, int nproc, const std::vector<std::string>& command,
                                   const std::map<std::string, std::string>& env = {}) {
  std::vector<std::string> argv{kBin, "run", "--nproc", std::to_string(nproc), "--master",
                                "127.0.0.1:" + std::to_string(port), "--"};
  argv.insert(argv.end(), command.begin(), command.end());
  auto job = std::make_unique<Process>(argv, env);
  int probe = raw_connect("127.0.0.1", port, milliseconds(20000));
  EXPECT_GE(probe, 0) << "the launcher's store never listened";
  if (probe >= 0) close(probe);
  return job;
}

// Stops a launcher the way a user would, so that it also stops its ranks.
ProcessResult stop(Process& job) {
  job.signal(SIGTERM);
  return job.wait(milliseconds(20000));
}

}  // namespace

TEST(StoreProcesses, JobRendezvousesWhileHostileClientsHoldTheStore) {
  const int port = free_port();
  // The ranks start a second late, so that the probes reach the store before them.
  auto job = start_job(port, 2, {"sh", "-c", "sleep 1; exec " + kWorker + " env"}, {{"CT_TIMEOUT_MS", "15000"}});
  int gib = raw_connect("127.0.0.1", port);
  raw_send(gib, gigabyte_prefix());
  int noise = raw_connect("127.0.0.1", port);
  raw_send(noise, garbage(100000));
  int stalled = raw_connect("127.0.0.1", port);
  raw_send(stalled, {'C', 'T', 'R', 'V'});
  std::this_thread::sleep_for(milliseconds(300));
  const double launcher_mib = peak_rss_mib(std::to_string(job->pid()));
  auto res = job->wait(milliseconds(60000));
  // The stalled client is still connected: the finished job must exit all the same.
  EXPECT_FALSE(res.timed_out) << res.output;
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "[rank 1] source=torchrun variables rank=1 world=2")) << res.output;
  EXPECT_TRUE(contains(res.output, "sum=2")) << res.output;
  EXPECT_LT(res.seconds, 20.0) << res.output;
  EXPECT_GT(launcher_mib, 0);
  EXPECT_LT(launcher_mib, 512.0) << "the launcher allocated for a stranger's 1 GiB length prefix";
  std::cout << "launcher peak RSS with the 1 GiB client connected: " << launcher_mib << " MiB; job took "
            << res.seconds << " s\n";
  for (int fd : {gib, noise, stalled}) close(fd);
}

TEST(StoreProcesses, LauncherStoreListensOnlyOnTheMasterAddress) {
  const int port = free_port();
  auto job = start_job(port, 1, {"sleep", "30"});
  int other = raw_connect("127.0.0.2", port);
  EXPECT_LT(other, 0) << "the store given --master 127.0.0.1 answered on 127.0.0.2";
  if (other >= 0) close(other);
  stop(*job);
}

TEST(StoreProcesses, SecondJobOnTheSamePortGetsOneClearLine) {
  const int port = free_port();
  auto first = start_job(port, 2, {"sleep", "30"});
  auto second = run_process({kBin, "run", "--nproc", "2", "--nnodes", "2", "--node-rank", "1", "--master",
                             "127.0.0.1:" + std::to_string(port), "--", kWorker, "env"},
                            {{"CT_TIMEOUT_MS", "10000"}}, milliseconds(40000));
  stop(*first);
  EXPECT_FALSE(second.timed_out) << second.output;
  EXPECT_NE(second.exit_code(), 0) << second.output;
  EXPECT_LT(second.seconds, 7.0) << second.output;  // at once: the launcher and a rank start, well under 10 s
  // Either rank may be refused first (the launcher then stops the other): one of them prints the line. The first
  // launcher made up a job id for its ranks; the second job's ranks have none (several nodes make none up).
  auto line = [&](int r) {
    return "[rank " + std::to_string(r) + "] rendezvous: joining on the store at 127.0.0.1:" + std::to_string(port) +
           ": refused this process: this store belongs to a job with job id '";
  };
  EXPECT_TRUE(contains(second.output, "but this process was started with no job id")) << second.output;
  EXPECT_TRUE(contains(second.output, line(2)) || contains(second.output, line(3))) << second.output;
  EXPECT_FALSE(contains(second.output, "INTERNAL ASSERT")) << second.output;
  EXPECT_FALSE(contains(second.output, "--nnodes?) (timeout")) << "a refusal is not a timeout:\n" << second.output;
  EXPECT_FALSE(contains(second.output, "address")  && contains(second.output, "size")) << second.output;
}

TEST(StoreProcesses, StrangerGivesUpAtOnceOrWithinItsTimeout) {
  const int port = free_port();
  // A job of two real ranks that stay connected (rank 1 stops at step 5; rank 0 waits 30 s for it).
  auto job = start_job(port, 2, {kWorker, "hang"}, {{"CT_TIMEOUT_MS", "30000"}, {"CROSSTRAIN_JOB_ID", "hang-job"}});
  // Both ranks hold their connections once they have printed this (after init_world), however loaded the machine.
  ASSERT_TRUE(job->wait_for_output("rank 0 joined", milliseconds(30000))) << "rank 0 never joined";
  ASSERT_TRUE(job->wait_for_output("rank 1 joined", milliseconds(30000))) << "rank 1 never joined";
  const std::string at = "127.0.0.1:" + std::to_string(port);
  auto of_job = [&](std::map<std::string, std::string> env) {
    env["CROSSTRAIN_JOB_ID"] = "hang-job";
    return env;
  };
  auto no_job = run_process({kWorker, "env"}, rank_env(1, 2, port, 10000), milliseconds(30000));
  EXPECT_EQ(no_job.exit_code(), 3) << no_job.output;
  EXPECT_TRUE(contains(no_job.output, "job id 'hang-job'")) << no_job.output;
  auto taken = run_process({kWorker, "env"}, of_job(rank_env(1, 2, port, 10000)), milliseconds(30000));
  EXPECT_EQ(taken.exit_code(), 3) << taken.output;
  EXPECT_TRUE(contains(taken.output, "[rank 1] rendezvous")) << taken.output;
  EXPECT_TRUE(contains(taken.output, at)) << taken.output;
  EXPECT_TRUE(contains(taken.output, "rank 1 is already connected")) << taken.output;
  auto other_world = run_process({kWorker, "env"}, of_job(rank_env(0, 3, port, 10000)), milliseconds(30000));
  EXPECT_EQ(other_world.exit_code(), 3) << other_world.output;
  EXPECT_TRUE(contains(other_world.output, "WORLD_SIZE=3")) << other_world.output;
  stop(*job);
  // A port where nothing answers the handshake: the stranger gives up at its timeout.
  int listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  socklen_t len = sizeof addr;
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  const int mute_port = ntohs(addr.sin_port);
  auto mute = run_process({kWorker, "env"}, rank_env(1, 2, mute_port, 3000), milliseconds(30000));
  close(listener);
  EXPECT_EQ(mute.exit_code(), 3) << mute.output;
  EXPECT_TRUE(contains(mute.output, "127.0.0.1:" + std::to_string(mute_port))) << mute.output;
  EXPECT_LT(mute.seconds, 3.0 + 5.0) << mute.output;  // its timeout, plus a libtorch start-up on a loaded machine
  std::cout << "stranger with a taken rank gave up after " << taken.seconds << " s, with another world size after "
            << other_world.seconds << " s, at a mute port (3 s timeout) after " << mute.seconds << " s\n";
  // Refused at once: one process start-up, well under the 10 s timeout they were given.
  for (const auto* r : {&no_job, &taken, &other_world}) EXPECT_LT(r->seconds, 6.0) << r->output;
}

TEST(StoreProcesses, AStoreBeyondLoopbackWithoutASecretWarnsOnce) {
  const std::vector<std::string> argv{kBin, "run", "--nproc", "1", "--master", "0.0.0.0:" + std::to_string(free_port()),
                                      "--", "true"};
  auto open = run_process(argv, {}, milliseconds(30000));
  EXPECT_EQ(open.exit_code(), 0) << open.output;
  const std::string warning = "crosstrain run: warning: the rendezvous store listens on 0.0.0.0:";
  EXPECT_TRUE(contains(open.output, warning)) << open.output;
  EXPECT_TRUE(contains(open.output, "without a job secret; anyone who reaches the port can join")) << open.output;
  EXPECT_EQ(open.output.find(warning), open.output.rfind(warning)) << open.output;
  auto closed = run_process(argv, {{"CROSSTRAIN_SECRET", "s3cret"}}, milliseconds(30000));
  EXPECT_EQ(closed.exit_code(), 0) << closed.output;
  EXPECT_FALSE(contains(closed.output, "warning")) << closed.output;
  auto loopback = run_process({kBin, "run", "--nproc", "1", "--", "true"}, {}, milliseconds(30000));
  EXPECT_FALSE(contains(loopback.output, "warning")) << loopback.output;
}
