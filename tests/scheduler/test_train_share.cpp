// What a cluster share of a recipe job runs (train_share.h): the launcher and trainer command line built from a
// placement, and what executors read back from a run folder (newest checkpoint, last metrics step).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/layout.h"
#include "crosstrain/scheduler/train_share.h"
#include "scratch.h"

namespace crosstrain::scheduler {
namespace {
namespace fs = std::filesystem;

JobRecord recipe_job() {
  JobRecord j;
  j.id = 7;
  j.spec.name = "tiny";
  j.spec.ranks = 4;
  j.spec.global_batch = 16;
  j.spec.steps = 40;
  j.spec.checkpoint_every = 10;
  j.spec.recipe = "/r/gpt-tiny.toml";
  j.spec.overrides = {"train.lr=0.001"};
  return j;
}

PlacementRecord two_shares() {
  PlacementRecord p;
  p.shares = {{"east", 2, "dp=2 tp=1 pp=1"}, {"west", 2, "dp=2 tp=1 pp=1"}};
  p.layout = "dp=4 tp=1 pp=1 zero=1 m=1 mb=4 fp32 diloco H=5";
  p.sync = planner::LayoutSync::DiLoCo;
  p.inner_steps = 5;
  return p;
}

TrainLaunch launch(const std::string& run_dir, const std::string& host, int port) {
  TrainLaunch l;
  l.crosstrain = "ct";
  l.run_dir = run_dir;
  l.master_host = host;
  l.master_port = port;
  l.rendezvous_timeout_s = 60;
  return l;
}

std::string joined(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

TEST(TrainShare, EachShareIsALauncherNodeMeetingAtShareZero) {
  TrainLaunch l = launch("/w/job7/run", "10.0.0.1", 29500);
  l.crosstrain = "/bin/crosstrain";
  l.rendezvous_timeout_s = 120;
  const std::string west = joined(train_share_argv(recipe_job(), two_shares(), 1, l));
  EXPECT_EQ(west,
            "/bin/crosstrain run --nproc 2 --nnodes 2:2 --node-rank 1 --timeout 120 --max-restarts 2 "
            "--master 10.0.0.1:29500 --cluster 1 "
            "-- /bin/crosstrain train /r/gpt-tiny.toml --set train.lr=0.001 --set run.dir=/w/job7/run "
            "--set train.steps=40 --set train.checkpoint_every=10 "
            "--set obs.metrics_host=127.0.0.1 --set run.fence=job7.a0 --set parallel.dp=4 --set parallel.tp=1 "
            "--set parallel.pp=1 --set parallel.zero=1 --set parallel.schedule=1f1b --set parallel.chunks=1 "
            "--set parallel.sequence_parallel=false --set train.micro_batches=1 --set train.precision=fp32 "
            "--set train.recompute=none --set parallel.bucket_mb=1 --set sync.mode=diloco --set sync.inner_steps=5 "
            "--set train.global_batch=16 --set sync.clusters=2 --set elastic.min_replicas=1")
      << "DiLoCo across clusters runs elastic: a lost cluster's share leaves, and joins again when started again";
  l.resume = true;
  const auto east = train_share_argv(recipe_job(), two_shares(), 0, l);
  EXPECT_NE(joined(east).find("--node-rank 0 "), std::string::npos);
  EXPECT_EQ(east.back(), "--resume");
}

TEST(TrainShare, OneClusterRunsSynchronouslyWithoutARendezvousAddress) {
  PlacementRecord p;
  p.shares = {{"east", 2, "dp=2 tp=1 pp=1"}};
  p.layout = "dp=2 tp=1 pp=1 zero=0 m=1 mb=8 fp32 sync";
  const std::string cmd = joined(train_share_argv(recipe_job(), p, 0, launch("/run", "h", 0)));
  EXPECT_EQ(cmd.find("--master"), std::string::npos) << cmd;
  EXPECT_EQ(cmd.find("sync.mode"), std::string::npos) << cmd;
  EXPECT_NE(cmd.find("--nproc 2 --nnodes 1 --node-rank 0"), std::string::npos) << cmd;
}

// Uneven shares (the placer fills the faster and fuller clusters first): each launcher learns every node's ranks,
// and DiLoCo's clusters are blocks of those sizes, averaging whole parameters (no ZeRO).
TEST(TrainShare, UnevenSharesNameEveryNodesRanksAndTheirClusters) {
  PlacementRecord p = two_shares();
  p.shares[0].ranks = 3;
  p.shares[1].ranks = 1;
  const std::string east = joined(train_share_argv(recipe_job(), p, 0, launch("/run", "h", 1)));
  EXPECT_NE(east.find("--nproc 3 --nnodes 2:2 --node-rank 0 "), std::string::npos) << east;
  EXPECT_NE(east.find("--node-sizes 3,1 "), std::string::npos) << east;
  EXPECT_NE(east.find("--set sync.cluster_ranks=3,1"), std::string::npos) << east;
  EXPECT_NE(east.find("--set parallel.zero=0"), std::string::npos) << east;
  EXPECT_EQ(east.find("parallel.zero=1"), std::string::npos) << east;
  const std::string even = joined(train_share_argv(recipe_job(), two_shares(), 0, launch("/run", "h", 1)));
  EXPECT_EQ(even.find("--node-sizes"), std::string::npos) << even;
  EXPECT_EQ(even.find("cluster_ranks"), std::string::npos) << even;
}

// A share with more ranks than one node of its cluster holds runs over several: east (3 ranks, 2 a node) is nodes 0
// and 1 of the job, west's share node 2. Each node is a launcher of its own size; on east srun starts one on each
// node of the allocation, which takes its size and number from SLURM_NODEID.
TEST(TrainShare, AShareLargerThanANodeRunsALauncherOnEachOfItsNodes) {
  EXPECT_EQ(share_node_sizes(3, 2), (std::vector<int>{2, 1}));
  EXPECT_EQ(share_node_sizes(4, 2), (std::vector<int>{2, 2}));
  EXPECT_EQ(share_node_sizes(2, 4), (std::vector<int>{2}));
  EXPECT_EQ(share_node_sizes(5, 0), (std::vector<int>{5})) << "a cluster without a node size: one node";
  PlacementRecord p = two_shares();
  p.shares[0].ranks = 3;
  p.shares[1].ranks = 1;
  TrainLaunch l = launch("/run", "h", 1);
  l.devices_per_node = {{"east", 2}, {"west", 2}};
  const std::string west = joined(train_share_argv(recipe_job(), p, 1, l));
  EXPECT_NE(west.find("--nproc 1 --nnodes 3:3 --node-rank 2 "), std::string::npos) << west;
  EXPECT_NE(west.find("--node-sizes 2,1,1 "), std::string::npos) << west;
  EXPECT_NE(west.find("--cluster 1 "), std::string::npos) << west;
  EXPECT_NE(west.find("--set sync.cluster_ranks=3,1"), std::string::npos) << "clusters stay blocks of ranks";
  EXPECT_NE(joined(train_share_argv(recipe_job(), p, 0, l, 1)).find("--nproc 1 --nnodes 3:3 --node-rank 1 "),
            std::string::npos);
  EXPECT_THROW(train_share_argv(recipe_job(), p, 0, l, 2), UsageError) << "east has two nodes";
  const std::string east = train_share_script(recipe_job(), p, 0, l);
  EXPECT_EQ(east.rfind("'srun' '--nodes=2' '--ntasks=2' '--ntasks-per-node=1' '--kill-on-bad-exit=1' 'sh' '-c' ", 0), 0u)
      << east;
  EXPECT_NE(east.find("k=$SLURM_NODEID; node=$((0 + k))"), std::string::npos) << east;
  EXPECT_NE(east.find("0) n=2;; 1) n=1;;"), std::string::npos) << east;
  EXPECT_NE(east.find("'\\''--nproc'\\'' \"$n\" '\\''--nnodes'\\'' '\\''3:3'\\'' '\\''--node-rank'\\'' \"$node\""),
            std::string::npos)
      << east;
}

// Share 0 of several nodes hosts the job's rendezvous on the node at its cluster's address (--cluster-host), which
// need not be the first node Slurm lists: that node is the share's node 0, the others follow in Slurm's order.
TEST(TrainShare, TheNodeAtTheClustersAddressIsNodeZeroOfTheFirstShare) {
  const fs::path bin = crosstrain::testing::scratch_dir("share-node-number");
  // Slurm's answers for a job on nodes a1, a2, a3, where a2 is at 10.0.0.2.
  std::ofstream(bin / "scontrol") << "#!/bin/sh\n"
                                     "if [ \"$1 $2\" = \"show node\" ]; then\n"
                                     "  echo 'NodeName=a1 Arch=x86_64 NodeAddr=10.0.0.1 NodeHostName=a1'\n"
                                     "  echo 'NodeName=a2 Arch=x86_64 NodeAddr=10.0.0.2 NodeHostName=a2'\n"
                                     "  echo 'NodeName=a3 Arch=x86_64 NodeAddr=10.0.0.3 NodeHostName=a3'\n"
                                     "else printf 'a1\\na2\\na3\\n'; fi\n";
  fs::permissions(bin / "scontrol", fs::perms::owner_all);
  const auto number = [&](int node_id, const std::string& addr) {
    const std::string script = "export PATH=" + bin.string() + ":$PATH SLURM_NODEID=" + std::to_string(node_id) +
                               " SLURM_JOB_NODELIST='a[1-3]'; " + share_node_number(addr) + "echo $k";
    FILE* out = ::popen(("sh -c " + shell_line({script}) + " 2>&1").c_str(), "r");
    char buf[256] = {0};
    const size_t n = std::fread(buf, 1, sizeof buf - 1, out);
    ::pclose(out);
    return std::string(buf, n);
  };
  EXPECT_EQ(number(1, "10.0.0.2"), "0\n");
  EXPECT_EQ(number(0, "10.0.0.2"), "1\n");
  EXPECT_EQ(number(2, "10.0.0.2"), "2\n");
  EXPECT_EQ(number(0, "10.0.0.1"), "0\n");
  EXPECT_EQ(number(2, "10.0.0.1"), "2\n");
  EXPECT_NE(number(0, "10.0.0.9").find("rendezvous address 10.0.0.9 is no node of this share"), std::string::npos);
  // Only share 0 hosts the rendezvous.
  PlacementRecord p = two_shares();
  p.shares[0].ranks = 4;
  p.shares[1].ranks = 4;
  TrainLaunch l = launch("/run", "h", 1);
  l.devices_per_node = {{"east", 2}, {"west", 2}};
  l.cluster_hosts = {{"east", "10.0.0.2"}, {"west", "10.1.0.1"}};
  EXPECT_NE(train_share_script(recipe_job(), p, 0, l).find("NodeAddr=10.0.0.2"), std::string::npos);
  EXPECT_EQ(train_share_script(recipe_job(), p, 1, l).find("NodeAddr="), std::string::npos);
  // ... and share 1 its standby store, where the placement has one (share 0 on one node, three shares).
  p.shares[0].ranks = 2;
  p.shares.push_back({"north", 2, "dp=2 tp=1 pp=1"});
  l.devices_per_node["north"] = 2;
  l.cluster_hosts["north"] = "10.2.0.1";
  l.standby_port = 2;
  p.standby = true;
  EXPECT_NE(train_share_script(recipe_job(), p, 1, l).find("NodeAddr=10.1.0.1"), std::string::npos);
  fs::remove_all(bin);
}

// Three clusters, DiLoCo: every launcher learns the standby store's address on share 1's node. Once share 0 was
// lost the job's store is there: every share starts against it, share 0 with --rejoin. Two clusters: no standby
// (the survivor alone is no majority).
TEST(TrainShare, AStandbyOnShareOnesNodeHoldsTheStoreOnceShareZeroWasLost) {
  PlacementRecord p = two_shares();
  p.shares.push_back({"north", 2, "dp=2 tp=1 pp=1"});
  EXPECT_TRUE(p.standby_possible(1));
  EXPECT_FALSE(p.standby_possible(2)) << "node 1 would be share 0's second node, not share 1's";
  EXPECT_FALSE(two_shares().standby_possible(1)) << "one survivor is no majority";
  EXPECT_EQ(joined(train_share_argv(recipe_job(), p, 2, launch("/run", "h", 1))).find("--standby"), std::string::npos)
      << "a placement made without a standby (before standbys) gets none";
  p.standby = true;
  TrainLaunch l = launch("/run", "h", 1);
  l.standby_port = 2;
  l.cluster_hosts = {{"east", "10.0.0.1"}, {"west", "10.1.0.1"}, {"north", "10.2.0.1"}};
  const std::string north = joined(train_share_argv(recipe_job(), p, 2, l));
  EXPECT_NE(north.find("--master 10.0.0.1:1 --cluster 2 --standby 10.1.0.1:2 "), std::string::npos) << north;
  EXPECT_EQ(north.find("--rejoin"), std::string::npos) << north;
  p.rendezvous_moved = true;
  const std::string again = joined(train_share_argv(recipe_job(), p, 0, l));
  EXPECT_NE(again.find("--master 10.1.0.1:2 --cluster 0 --standby 10.1.0.1:2 --rejoin "), std::string::npos) << again;
  EXPECT_EQ(joined(train_share_argv(recipe_job(), p, 2, l)).find("--rejoin"), std::string::npos);
  EXPECT_NE(joined(train_share_argv(recipe_job(), p, 2, l)).find("--master 10.0.0.1:1 --cluster 2 --standby 10.1.0.1:2 "),
            std::string::npos) << "a later share names node 0's store: its launcher finds where the job is";
  EXPECT_EQ(joined(train_share_argv(recipe_job(), two_shares(), 1, l)).find("--standby"), std::string::npos);
  l.standby_port = 0;
  EXPECT_THROW(train_share_argv(recipe_job(), p, 1, l), UsageError) << "a standby without its port";
  // With sites the job's outputs are read where rank 0 writes them: at share 1's site once its standby holds the
  // store (outputs_follow_store); with one run folder nothing moves.
  const fs::path outputs = crosstrain::testing::scratch_dir("share-outputs");
  EXPECT_FALSE(job_has_sites(outputs.string(), 9));
  outputs_follow_store(outputs.string(), 9, p);
  EXPECT_FALSE(job_has_sites(outputs.string(), 9)) << "no sites: no pointer to move";
  fs::create_directories(outputs / "job9");
  std::ofstream(outputs / "job9" / "run_dir") << site_run_dir(outputs.string(), "east", 9) << "\n";
  EXPECT_TRUE(job_has_sites(outputs.string(), 9));
  outputs_follow_store(outputs.string(), 9, p);
  EXPECT_EQ(job_run_dir(outputs.string(), 9), site_run_dir(outputs.string(), "west", 9));
  fs::remove_all(outputs);
  // The ports: fresh ones when share 0 starts a placement, the recorded ones otherwise.
  const fs::path work = crosstrain::testing::scratch_dir("share-ports");
  const PlacementPorts fresh = placement_ports(work.string(), 7, true);
  EXPECT_GT(fresh.standby, 0);
  EXPECT_NE(fresh.standby, fresh.rendezvous);
  const PlacementPorts read = placement_ports(work.string(), 7, false);
  EXPECT_EQ(read.rendezvous, fresh.rendezvous);
  EXPECT_EQ(read.standby, fresh.standby);
  fs::remove_all(work);
}

TEST(TrainShare, AJobWithoutARecipeIsRefused) {
  JobRecord bare = recipe_job();
  bare.spec.recipe.clear();
  EXPECT_THROW(train_share_argv(bare, two_shares(), 0, launch("/run", "h", 1)), UsageError);
}

// With a ledger, the ranks keep a work log (and at most ZeRO-1, whose ranks hold whole gradients) and the share
// signs its cluster's steps while it trains and at its end, keeping the launcher's exit status.
TEST(TrainShare, WithALedgerEachShareClaimsItsClustersWork) {
  TrainLaunch l = launch("/w/job7/run", "h", 1);
  l.ledger = "/l/ledger.jsonl";
  l.ledger_keys = "/keys";
  l.claim_every_s = 20;
  PlacementRecord p = two_shares();
  p.layout = "dp=4 tp=1 pp=1 zero=2 m=1 mb=4 fp32 diloco H=5";
  p.attempt = 2;
  const std::string script = train_share_script(recipe_job(), p, 1, l);
  EXPECT_NE(script.find("'run.work_log=true'"), std::string::npos) << script;
  // ZeRO-2 is lowered to 1 before the layout becomes overrides: one parallel.zero, not a second one that wins.
  EXPECT_NE(script.find("'parallel.zero=1'"), std::string::npos) << script;
  EXPECT_EQ(script.find("'parallel.zero=1'"), script.rfind("'parallel.zero=1'")) << script;
  EXPECT_EQ(script.find("parallel.zero=2"), std::string::npos) << script;
  const std::string claim = "'ct' 'ledger' 'claim' '/l/ledger.jsonl' '--run-dir' '/w/job7/run' '--cluster' 'west' "
                            "'--work-log' 'west.a2' '--key' '/keys/west.key' '--job' 'tiny-7.a2' '--keys' "
                            "'/keys/keys.json'";
  EXPECT_NE(script.find("while sleep 20; do " + claim), std::string::npos) << script;
  // The share seals its cross-cluster groups under its cluster's key too.
  EXPECT_NE(script.find("'comm.identity=/keys/west.key' '--set' 'comm.peer_keys=/keys/keys.json'"), std::string::npos)
      << script;
  EXPECT_EQ(script.substr(script.size() - 13), "\nexit $status") << script;
  // Clusters without the scheduler's disk claim over its API.
  l.ledger_url = "https://10.79.0.1:8650";
  const std::string remote = train_share_script(recipe_job(), p, 1, l);
  EXPECT_NE(remote.find("'ledger' 'claim' 'https://10.79.0.1:8650' '--run-dir'"), std::string::npos) << remote;
  EXPECT_EQ(remote.find("/l/ledger.jsonl"), std::string::npos) << remote;
  EXPECT_EQ(train_share_script(recipe_job(), p, 1, launch("/w/job7/run", "h", 1)).find("ledger"), std::string::npos);
  EXPECT_EQ(train_share_script(recipe_job(), p, 1, launch("/w/job7/run", "h", 1)).find("comm.identity"), std::string::npos);
}

// The scheduler and `crosstrain plan` turn a layout into overrides through one bridge (Layout::train_overrides):
// every choice plan prints for a layout reaches the ranks (shape, micro-batches, precision, recompute, buckets,
// sync), except the global batch (the job's own) and plan's sync.mode = "sync", which the scheduler leaves to
// the recipe.
// Every value a share's script is built from is one quoted shell word (names are checked when they come in; a
// cluster name went into the script unquoted before, and ran as a command).
TEST(TrainShare, TheScriptQuotesTheClusterAndItsFiles) {
  PlacementRecord p = two_shares();
  p.shares[1].cluster = "west$(touch /tmp/x)'";
  const std::string script = share_script(recipe_job(), p, 1, "true", "/w/job 7/share1");
  EXPECT_NE(script.find(R"(CROSSTRAIN_CLUSTER_NAME='west$(touch /tmp/x)'\''')"), std::string::npos) << script;
  EXPECT_NE(script.find("mv '/w/job 7/share1.exit.tmp' '/w/job 7/share1.exit'"), std::string::npos) << script;
  // A Slurm share's script writes nothing of its own: Slurm reports how it ended.
  const std::string slurm = share_script(recipe_job(), p, 1, "true", "");
  EXPECT_EQ(slurm.find(".exit"), std::string::npos) << slurm;
  EXPECT_EQ(slurm.substr(slurm.size() - 9), "(\ntrue\n)\n") << slurm;
}

TEST(TrainShare, OverridesOfALayoutAgreeWithThePlans) {
  for (planner::LayoutSync sync : planner::kLayoutSyncs) {
    planner::Layout l = planner::parse_layout("dp=4 tp=2 pp=2 zero=1 1f1b m=4 mb=1 bf16");
    l.sync = sync;
    l.inner_steps = sync == planner::LayoutSync::DiLoCo ? 20 : 1;
    PlacementRecord p;
    p.shares = {{"east", 8, "dp=2 tp=2 pp=2"}, {"west", 8, "dp=2 tp=2 pp=2"}};
    p.layout = l.describe();
    p.sync = l.sync;
    p.inner_steps = l.inner_steps;
    const std::vector<std::string> argv = train_share_argv(recipe_job(), p, 0, launch("/run", "h", 1));
    std::set<std::string> scheduler, plan;
    for (size_t i = 1; i < argv.size(); ++i)
      if (argv[i - 1] == "--set" && argv[i] != "train.lr=0.001" &&
          (argv[i].rfind("parallel.", 0) == 0 || argv[i].rfind("sync.", 0) == 0 || argv[i].rfind("train.", 0) == 0))
        scheduler.insert(argv[i]);
    for (const std::string& o : l.train_overrides())
      if (o != "sync.mode=sync" && o.rfind("train.global_batch=", 0) != 0) plan.insert(o);
    // The job's own steps, checkpoints and batch; the clusters are the placement's, not the layout's (the
    // scheduler names them for elastic DiLoCo).
    for (const char* own : {"train.steps=40", "train.checkpoint_every=10", "train.global_batch=16"}) plan.insert(own);
    if (sync == planner::LayoutSync::DiLoCo) plan.insert("sync.clusters=2");
    EXPECT_EQ(scheduler, plan) << planner::to_string(sync);
    for (const char* choice : {"parallel.tp=2", "train.micro_batches=4", "train.precision=bf16", "parallel.schedule=1f1b"})
      EXPECT_EQ(scheduler.count(choice), 1u) << choice << " reaches the ranks";
  }
}

// Real sites: the job's rendezvous is on share 0's cluster, reached at that cluster's address by every share.
TEST(TrainShare, EveryShareMeetsAtTheAddressOfShareZerosCluster) {
  TrainLaunch l = launch("/w/job7/run", "10.0.0.1", 29500);
  l.cluster_hosts = {{"east", "10.77.0.1"}, {"west", "10.77.1.1"}};
  for (size_t share : {0u, 1u}) {
    const std::string argv = joined(train_share_argv(recipe_job(), two_shares(), share, l));
    EXPECT_NE(argv.find("--master 10.77.0.1:29500"), std::string::npos) << argv;
  }
  PlacementRecord flipped = two_shares();
  std::swap(flipped.shares[0], flipped.shares[1]);
  EXPECT_NE(joined(train_share_argv(recipe_job(), flipped, 1, l)).find("--master 10.77.1.1:29500"), std::string::npos);
  l.cluster_hosts.clear();
  EXPECT_NE(joined(train_share_argv(recipe_job(), two_shares(), 1, l)).find("--master 10.0.0.1:29500"), std::string::npos)
      << "a cluster not named: --master-host";
}

TEST(TrainShare, ALedgerJobNameLeadsBackToItsJob) {
  JobRecord j = recipe_job();
  j.spec.name = "my-run";
  PlacementRecord p = two_shares();
  p.attempt = 3;
  EXPECT_EQ(ledger_job(j, p), "my-run-7.a3");
  EXPECT_EQ(job_of_ledger_job(ledger_job(j, p)), 7);
  for (const char* foreign : {"tiny-7", "x.a1", "tiny-.a1", "tiny-7.a", "tiny-7x.a1", "tiny-99999999999999999999.a1"})
    EXPECT_EQ(job_of_ledger_job(foreign), -1) << foreign;
}

TEST(TrainShare, ShellLineQuotesEveryArgument) {
  EXPECT_EQ(shell_line({"a b", "it's", "$HOME"}), "'a b' 'it'\\''s' '$HOME'");
}

TEST(TrainShare, NewestCompleteCheckpointAndLastWholeMetricsLine) {
  const fs::path run = crosstrain::testing::scratch_path("share");
  EXPECT_EQ(newest_checkpoint_step(run.string()), 0);
  for (const char* d : {"step_00000010", "step_00000020", "step_00000030.tmp", "step_00000040"})
    fs::create_directories(run / "checkpoints" / d);
  for (const char* d : {"step_00000010", "step_00000020", "step_00000030.tmp"})
    std::ofstream(run / "checkpoints" / d / "manifest.json") << "{}";
  EXPECT_EQ(newest_checkpoint_step(run.string()), 20) << "30 is still being written, 40 has no manifest";
  std::ofstream(run / "metrics.jsonl") << "{\"step\": 1}\n{\"step\": 2}\n{\"step\": 3, \"lo";
  EXPECT_EQ(last_metrics_step(run.string()), 2) << "the last line is still being written";
  EXPECT_EQ(job_run_dir("/w", 7), "/w/job7/run");
  fs::remove_all(run);
}

TEST(TrainShare, ShareCommandsOfOnePlacementShareOneFreshPort) {
  const fs::path work = crosstrain::testing::scratch_dir("share-port");
  const auto command = train_share_command(launch("", "127.0.0.1", 0), work.string());
  const std::string first = command(recipe_job(), two_shares(), 0), second = command(recipe_job(), two_shares(), 1);
  const auto port = [](const std::string& s) { return s.substr(s.find("'--master' ") + 11, 18); };
  EXPECT_EQ(port(first), port(second)) << first << "\n" << second;
  EXPECT_NE(first.find("'run.dir=" + (work / "job7" / "run").string() + "'"), std::string::npos) << first;
  EXPECT_GT(free_port(), 0);
  fs::remove_all(work);
}

// Issue 34: every job the scheduler starts has a secret of its own (its store refuses other jobs' ranks, and
// comm.encrypt seals what crosses clusters), and the scheduler's settings come after the job's own overrides.
TEST(TrainShare, EveryJobGetsASecretOfItsOwnAndTheSchedulersSettingsWin) {
  const fs::path work = crosstrain::testing::scratch_dir("share-secret");
  const auto command = train_share_command(launch("", "127.0.0.1", 0), work.string());
  const std::string script = command(recipe_job(), two_shares(), 0);
  const std::string file = (work / "job7" / "secret").string();
  // The executor hands it over in the share's environment: the script never reads the scheduler's folder.
  EXPECT_EQ(script.find("CROSSTRAIN_SECRET"), std::string::npos) << script;
  EXPECT_EQ(script.find(file), std::string::npos) << script;
  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::string secret;
  std::ifstream(file) >> secret;
  EXPECT_EQ(secret.size(), 64u);
  EXPECT_EQ(secret.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(script.find(secret), std::string::npos) << "the secret itself is in the script";
  EXPECT_EQ(job_secret(work.string(), 7), secret);
  command(recipe_job(), two_shares(), 1);
  std::string again;
  std::ifstream(file) >> again;
  EXPECT_EQ(again, secret) << "a job keeps its secret across shares and attempts";
  JobRecord other = recipe_job();
  other.id = 8;
  command(other, two_shares(), 0);
  std::string theirs;
  std::ifstream(work / "job8" / "secret") >> theirs;
  EXPECT_NE(theirs, secret);
  // An override stored before the scheduler refused them: the scheduler's run.dir comes later and wins.
  JobRecord sneaky = recipe_job();
  sneaky.spec.overrides = {"run.dir=/elsewhere", "obs.metrics_host=0.0.0.0"};
  const std::string argv = joined(train_share_argv(sneaky, two_shares(), 0, launch("/w/job7/run", "10.0.0.1", 29500)));
  EXPECT_LT(argv.find("run.dir=/elsewhere"), argv.find("run.dir=/w/job7/run")) << argv;
  EXPECT_LT(argv.find("obs.metrics_host=0.0.0.0"), argv.find("obs.metrics_host=127.0.0.1")) << argv;
  fs::remove_all(work);
}

}  // namespace
// Sites without the submitter's disk: the recipe travels in the share's script (as submitted) and is written into
// the share's run folder at its site, where the ranks train from it; any text survives the trip byte for byte.
TEST(TrainShare, TheRecipeTravelsInTheScriptAndTheRanksTrainFromItsCopy) {
  const fs::path run = crosstrain::testing::scratch_dir("share-recipe") / "site run";
  JobRecord job = recipe_job();
  job.spec.recipe_text = "name = \"it's $(touch /tmp/ct-pwned) `x` \\\"q\\\"\"\n# \xc3\xbcnicode\n\n";
  const std::string script = train_share_script(job, two_shares(), 1, launch(run.string(), "h", 1));
  const std::string copy = (run / "recipe" / "gpt-tiny.toml").string();
  EXPECT_NE(script.find("'train' '" + copy + "'"), std::string::npos) << script;
  EXPECT_EQ(script.find("/r/gpt-tiny.toml"), std::string::npos) << script;
  const std::string first = script.substr(0, script.find('\n'));
  ASSERT_EQ(std::system(("bash -c " + shell_line({first})).c_str()), 0) << first;
  std::ifstream in(copy, std::ios::binary);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), job.spec.recipe_text);
  EXPECT_FALSE(fs::exists("/tmp/ct-pwned"));
  // A spec from before the text travelled: the ranks read the recipe where it was submitted.
  EXPECT_NE(train_share_script(recipe_job(), two_shares(), 1, launch(run.string(), "h", 1)).find("'/r/gpt-tiny.toml'"),
            std::string::npos);
  fs::remove_all(run.parent_path());
}

}  // namespace crosstrain::scheduler
