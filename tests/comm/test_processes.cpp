// Real processes over loopback: the launcher, rendezvous, failure detection and the benchmark.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <thread>

#include "subprocess.h"

using namespace crosstrain::testing;
using std::chrono::milliseconds;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kWorker = CT_WORKER_BIN;

// Ranks started by hand: rank 0 hosts the store.
std::map<std::string, std::string> rank_env(int rank, int world, int port, int timeout_ms) {
  return launched_rank_env(rank, world, port, timeout_ms, /*launcher_hosts_store=*/false);
}

struct Ranks {
  std::vector<std::unique_ptr<Process>> procs;
  std::vector<ProcessResult> results;
  void start(int world, const std::string& mode, int timeout_ms) {
    int port = free_port();
    for (int r = 0; r < world; ++r)
      procs.push_back(std::make_unique<Process>(std::vector<std::string>{kWorker, mode}, rank_env(r, world, port, timeout_ms)));
  }
  void wait(milliseconds deadline) {
    for (auto& p : procs) results.push_back(p->wait(deadline));
  }
};

}  // namespace

TEST(Gloo, DeadPeerFailsEveryOtherRankQuickly) {
  Ranks ranks;
  ranks.start(3, "die", 20000);
  ranks.wait(milliseconds(30000));
  EXPECT_EQ(ranks.results[1].exit_code(), 128 + SIGKILL) << ranks.results[1].output;
  for (int r : {0, 2}) {
    const auto& res = ranks.results[r];
    EXPECT_FALSE(res.timed_out) << "rank " << r << " hung:\n" << res.output;
    EXPECT_EQ(res.exit_code(), 3) << res.output;
    EXPECT_TRUE(contains(res.output, "[rank " + std::to_string(r) + "] allreduce(avg) on group 'world' (3 ranks)"))
        << res.output;
    EXPECT_TRUE(contains(res.output, "step 5")) << res.output;
    // Well within the 20 s timeout: a closed connection is seen at once.
    EXPECT_LT(res.seconds, 15.0) << res.output;
  }
}

TEST(Gloo, SilentPeerTimesOut) {
  Ranks ranks;
  ranks.start(2, "hang", 4000);
  auto result0 = ranks.procs[0]->wait(milliseconds(20000));
  EXPECT_FALSE(result0.timed_out) << result0.output;
  EXPECT_EQ(result0.exit_code(), 3) << result0.output;
  EXPECT_TRUE(contains(result0.output, "[rank 0] allreduce(avg)")) << result0.output;
  EXPECT_TRUE(contains(result0.output, "timeout 4 s")) << result0.output;
  EXPECT_LT(result0.seconds, 15.0);
}

TEST(Rendezvous, UnreachableStoreFailsNamingTheAddress) {
  int port = free_port();
  auto env = rank_env(1, 2, port, 1500);
  auto res = run_process({kWorker, "env"}, env, milliseconds(20000));
  EXPECT_FALSE(res.timed_out);
  EXPECT_EQ(res.exit_code(), 3) << res.output;
  EXPECT_TRUE(contains(res.output, "127.0.0.1:" + std::to_string(port))) << res.output;
  EXPECT_TRUE(contains(res.output, "rendezvous")) << res.output;
  EXPECT_LT(res.seconds, 10.0);
}

TEST(Launcher, FailedRankStopsTheOthers) {
  auto res = run_process({kBin, "run", "--nproc", "3", "--", "sh", "-c", "test $RANK = 1 && exit 7; sleep 60"}, {},
                         milliseconds(30000));
  EXPECT_FALSE(res.timed_out);
  EXPECT_EQ(res.exit_code(), 7) << res.output;
  EXPECT_TRUE(contains(res.output, "rank 1")) << res.output;
  EXPECT_TRUE(contains(res.output, "exit code 7")) << res.output;
  EXPECT_LT(res.seconds, 10.0);
}

TEST(Launcher, ExportsTheNodesCluster) {
  auto res = run_process({kBin, "run", "--nproc", "2", "--cluster", "3", "--", "sh", "-c", "test \"$CROSSTRAIN_CLUSTER\" = 3"},
                         {}, milliseconds(30000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
}

TEST(Launcher, RankKilledBySignalIsNamed) {
  auto res = run_process({kBin, "run", "--nproc", "2", "--", "sh", "-c", "test $RANK = 0 && kill -9 $$; sleep 60"},
                         {}, milliseconds(30000));
  EXPECT_NE(res.exit_code(), 0);
  EXPECT_TRUE(contains(res.output, "rank 0")) << res.output;
  EXPECT_TRUE(contains(res.output, "signal 9")) << res.output;
  EXPECT_LT(res.seconds, 10.0);
}

TEST(Launcher, SetsTorchrunVariablesAndPrefixesOutput) {
  auto res = run_process({kBin, "run", "--nproc", "2", "--", "sh", "-c",
                          "echo hello $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR; echo err $RANK >&2"},
                         {}, milliseconds(30000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "[rank 0] hello 0 2 0 2 127.0.0.1")) << res.output;
  EXPECT_TRUE(contains(res.output, "[rank 1] hello 1 2 1 2 127.0.0.1")) << res.output;
  EXPECT_TRUE(contains(res.output, "[rank 1] err 1")) << res.output;
}

TEST(Launcher, ForwardsSigterm) {
  Process p({kBin, "run", "--nproc", "2", "--", "sh", "-c",
             "trap 'echo got-term $RANK; exit 0' TERM; echo ready; while true; do sleep 0.1; done"});
  // Both ranks have installed their trap once they print "ready".
  ASSERT_TRUE(p.wait_for_output("[rank 0] ready", milliseconds(20000)));
  ASSERT_TRUE(p.wait_for_output("[rank 1] ready", milliseconds(20000)));
  p.signal(SIGTERM);
  auto res = p.wait(milliseconds(15000));
  EXPECT_FALSE(res.timed_out) << res.output;
  EXPECT_EQ(res.exit_code(), 128 + SIGTERM) << res.output;
  EXPECT_TRUE(contains(res.output, "got-term 0")) << res.output;
  EXPECT_TRUE(contains(res.output, "got-term 1")) << res.output;
}

TEST(Launcher, PortInUseGetsAClearMessage) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(s, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  auto res = run_process({kBin, "run", "--nproc", "1", "--master", "127.0.0.1:" + std::to_string(port), "--", "true"},
                         {}, milliseconds(30000));
  close(s);
  EXPECT_EQ(res.exit_code(), 2) << res.output;
  EXPECT_TRUE(contains(res.output, "port " + std::to_string(port) + " is already in use")) << res.output;
}

TEST(Launcher, BadCommandLines) {
  auto bad = [](std::vector<std::string> args, const std::string& expect) {
    args.insert(args.begin(), kBin);
    auto res = run_process(args, {}, milliseconds(20000));
    EXPECT_NE(res.exit_code(), 0) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << "expected '" << expect << "' in:\n" << res.output;
  };
  bad({"run", "--nproc", "0", "--", "true"}, "--nproc");
  bad({"run", "--nproc", "2"}, "command");
  bad({"run", "--nproc", "2", "--master", "nohost", "--", "true"}, "HOST:PORT");
  bad({"run", "--nnodes", "2", "--node-rank", "5", "--master", "127.0.0.1:1", "--", "true"}, "--node-rank");
  bad({"run", "--nproc", "1", "--", "/nonexistent/program"}, "cannot start");
  bad({"frobnicate"}, "frobnicate");
  bad({"bench", "comm", "--op", "allsorts", "--nproc", "1"}, "allsorts");
  bad({"bench", "comm", "--sizes", "huge", "--nproc", "1"}, "--sizes");
}

TEST(Launcher, RunsGlooRanks) {
  auto res = run_process({kBin, "run", "--nproc", "3", "--", kWorker, "env"}, {}, milliseconds(60000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(contains(res.output, "[rank " + std::to_string(r) + "] source=torchrun variables rank=" +
                                         std::to_string(r) + " world=3 local_rank=" + std::to_string(r)))
        << res.output;
  EXPECT_TRUE(contains(res.output, "sum=3")) << res.output;
}

// Nodes of different sizes (a scheduler's uneven shares): every launcher is given each node's ranks, and the
// ranks number on from the nodes before (node 1's single rank is rank 2 of 3).
TEST(Launcher, NodesOfDifferentSizesMakeOneWorld) {
  const std::string master = "127.0.0.1:" + std::to_string(free_port());
  std::vector<std::unique_ptr<Process>> nodes;
  for (int node : {0, 1})
    nodes.push_back(std::make_unique<Process>(std::vector<std::string>{
        kBin, "run", "--nproc", node == 0 ? "2" : "1", "--nnodes", "2", "--node-rank", std::to_string(node),
        "--node-sizes", "2,1", "--master", master, "--", kWorker, "env"}));
  std::string all;
  for (auto& n : nodes) {
    const auto res = n->wait(milliseconds(60000));
    EXPECT_EQ(res.exit_code(), 0) << res.output;
    all += res.output;
  }
  for (int r = 0; r < 3; ++r)
    EXPECT_TRUE(contains(all, "[rank " + std::to_string(r) + "] source=torchrun variables rank=" + std::to_string(r) +
                                  " world=3 local_rank=" + std::to_string(r == 2 ? 0 : r)))
        << all;
  EXPECT_TRUE(contains(all, "sum=3")) << all;
  auto refused = [](std::vector<std::string> args, const std::string& expect) {
    const auto res = run_process(args, {}, milliseconds(20000));
    EXPECT_EQ(res.exit_code(), 2) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << res.output;
  };
  refused({kBin, "run", "--nproc", "1", "--nnodes", "2", "--node-sizes", "2,1", "--master", master, "--", "true"},
          "--node-sizes gives node 0 2 ranks but --nproc is 1");
  refused({kBin, "run", "--nproc", "2", "--nnodes", "3", "--node-sizes", "2,1", "--master", master, "--", "true"},
          "--node-sizes gives 2 nodes but --nnodes is 3");
  refused({kBin, "run", "--nproc", "2", "--nnodes", "2", "--node-sizes", "2,x", "--master", master, "--", "true"},
          "like 2,1,1");
}

TEST(Launcher, StartsUnderSrunVariables) {
  int port = free_port();
  std::vector<std::unique_ptr<Process>> procs;
  for (int r = 0; r < 2; ++r)
    procs.push_back(std::make_unique<Process>(
        std::vector<std::string>{kWorker, "env"},
        std::map<std::string, std::string>{{"SLURM_PROCID", std::to_string(r)}, {"SLURM_NTASKS", "2"},
                                           {"SLURM_LOCALID", std::to_string(r)}, {"SLURM_NTASKS_PER_NODE", "2"},
                                           {"SLURM_JOB_NODELIST", "localhost"}, {"MASTER_PORT", std::to_string(port)},
                                           {"RANK", ""}, {"WORLD_SIZE", ""}, {"MASTER_ADDR", ""}}));
  for (int r = 0; r < 2; ++r) {
    auto res = procs[r]->wait(milliseconds(60000));
    EXPECT_EQ(res.exit_code(), 0) << res.output;
    EXPECT_TRUE(contains(res.output, "source=srun rank=" + std::to_string(r) + " world=2")) << res.output;
    EXPECT_TRUE(contains(res.output, "master=localhost")) << res.output;
    EXPECT_TRUE(contains(res.output, "sum=2")) << res.output;
  }
}

TEST(Launcher, StartsUnderMpirun) {
  if (system("command -v mpirun > /dev/null 2>&1") != 0) GTEST_SKIP() << "mpirun is not installed";
  int port = free_port();
  auto res = run_process({"mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
                          "MASTER_PORT=" + std::to_string(port), kWorker, "env"},
                         {{"RANK", ""}, {"WORLD_SIZE", ""}, {"OMPI_MCA_plm_rsh_agent", ""}}, milliseconds(60000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "source=mpirun rank=0 world=2")) << res.output;
  EXPECT_TRUE(contains(res.output, "source=mpirun rank=1 world=2")) << res.output;
  EXPECT_TRUE(contains(res.output, "sum=2")) << res.output;
}

TEST(BenchComm, PrintsTableAndJson) {
  std::string json = ::testing::TempDir() + "/bench_comm.json";
  auto res = run_process({kBin, "bench", "comm", "--op", "allreduce", "--backend", "gloo", "--nproc", "2",
                          "--sizes", "4:1M", "--step-factor", "4", "--json", json},
                         {}, milliseconds(120000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "time(us)")) << res.output;
  EXPECT_TRUE(contains(res.output, "busbw(GB/s)")) << res.output;
  EXPECT_TRUE(contains(res.output, "#wrong")) << res.output;
  std::ifstream in(json);
  ASSERT_TRUE(in.good());
  auto rows = nlohmann::json::parse(in);
  ASSERT_EQ(rows.size(), 10u);  // 4 B .. 1 MiB by 4
  for (const auto& row : rows) {
    for (const char* key : {"size", "count", "time_us", "algbw", "busbw", "wrong"}) EXPECT_TRUE(row.contains(key)) << key;
    EXPECT_EQ(row["wrong"], 0);
    EXPECT_GT(row["time_us"].get<double>(), 0.0);
    EXPECT_NEAR(row["busbw"].get<double>(), row["algbw"].get<double>(), 1e-9);  // factor 1 at 2 ranks
  }
}

TEST(BenchComm, EveryCollectiveOnThreeRanks) {
  auto res = run_process({kBin, "bench", "comm", "--op", "all", "--nproc", "3", "--sizes", "1K:64K",
                          "--step-factor", "64", "--iters", "3", "--warmup", "1"},
                         {}, milliseconds(120000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  for (const char* op : {"allreduce", "broadcast", "reduce", "allgather", "reducescatter", "alltoall", "gather",
                         "scatter", "sendrecv"})
    EXPECT_TRUE(contains(res.output, std::string("op ") + op + ",")) << op;
}

TEST(BenchComm, CompressionAlgorithmsAndCostModel) {
  auto res = run_process({kBin, "bench", "comm", "--op", "allreduce", "--redop", "avg", "--compression", "int8",
                          "--nproc", "2", "--sizes", "64K"},
                         {}, milliseconds(120000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "3.94x fewer")) << res.output;
  for (const char* a : {"ring", "tree", "hd", "hierarchical", "auto"}) {
    auto r = run_process({kBin, "bench", "comm", "--op", "allreduce", "--algo", a, "--nproc", "2", "--sizes", "1K:64K",
                          "--step-factor", "64", "--iters", "3"},
                         {}, milliseconds(120000));
    EXPECT_EQ(r.exit_code(), 0) << a << "\n" << r.output;  // non-zero #wrong fails the command
  }
  auto model = run_process({kBin, "bench", "cost-model", "--nproc", "2", "--repeat", "2"}, {}, milliseconds(120000));
  ASSERT_EQ(model.exit_code(), 0) << model.output;
  EXPECT_TRUE(contains(model.output, "predicted(us)")) << model.output;
  EXPECT_TRUE(contains(model.output, "medians over 2 repetitions")) << model.output;
  for (const char* a : {"ring", "tree", "hd"})
    EXPECT_TRUE(contains(model.output, std::string("cost_model_within_25pct_allreduce_") + a + "=")) << model.output;
  // Links from a topology file instead of a calibration: its figures are the ones printed.
  const std::string topology = ::testing::TempDir() + "/bench_topology.toml";
  std::ofstream(topology) << "[links.host]\nlatency_us = 40\nbandwidth_gbps = 32\n"
                             "[links.cluster]\nlatency_us = 50\nbandwidth_gbps = 10\n"
                             "[links.wan]\nlatency_us = 25000\nbandwidth_gbps = 0.1\n"
                             "[[hosts]]\nname = \"here\"\nranks = 2\n";
  auto from_file = run_process({kBin, "bench", "cost-model", "--nproc", "2", "--repeat", "1", "--topology", topology,
                                "--op", "all"},
                               {}, milliseconds(120000));
  ASSERT_EQ(from_file.exit_code(), 0) << from_file.output;
  EXPECT_TRUE(contains(from_file.output, "links from " + topology)) << from_file.output;
  EXPECT_TRUE(contains(from_file.output, "alpha = 40.0 us, bandwidth = 4.00 GB/s")) << from_file.output;
  for (const char* op : {"allreduce", "reducescatter", "allgather", "broadcast"})
    EXPECT_TRUE(contains(from_file.output, std::string("cost_model_within_25pct_") + op + "_hd=")) << from_file.output;
  std::ofstream(topology) << "[links.host]\nlatency_us = 40\n";
  auto bad_file = run_process({kBin, "bench", "cost-model", "--nproc", "2", "--topology", topology}, {},
                              milliseconds(60000));
  EXPECT_NE(bad_file.exit_code(), 0);
  EXPECT_TRUE(contains(bad_file.output, "bandwidth_gbps")) << bad_file.output;
  auto bad = run_process({kBin, "bench", "comm", "--op", "broadcast", "--compression", "int8", "--nproc", "1"}, {},
                         milliseconds(60000));
  EXPECT_NE(bad.exit_code(), 0);
  EXPECT_TRUE(contains(bad.output, "--compression applies to --op allreduce")) << bad.output;
}
