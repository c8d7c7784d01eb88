#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"

using namespace crosstrain;

TEST(LaunchEnv, SingleProcessByDefault) {
  LaunchEnv e = detect_launch_env({});
  EXPECT_EQ(e.source, LaunchSource::Single);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
}

TEST(LaunchEnv, TorchrunVariables) {
  LaunchEnv e = detect_launch_env({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "1234"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  EXPECT_EQ(e.source, LaunchSource::Torchrun);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_TRUE(e.store_hosted_by_launcher);
}

// crosstrain run --standby: every rank learns where the job goes on when node 0's store is lost.
TEST(LaunchEnv, TheStandbyStoreComesAsHostAndPort) {
  const EnvMap base{{"RANK", "0"}, {"WORLD_SIZE", "2"}};
  EXPECT_EQ(detect_launch_env(base).standby_port, 0);
  EnvMap env = base;
  env["CROSSTRAIN_STANDBY"] = "10.0.0.2:29501";
  const LaunchEnv e = detect_launch_env(env);
  EXPECT_EQ(e.standby_addr, "10.0.0.2");
  EXPECT_EQ(e.standby_port, 29501);
  for (const std::string bad : {"10.0.0.2", ":29501", "h:0", "h:70000", "h:12ab", "h:"}) {
    env["CROSSTRAIN_STANDBY"] = bad;
    EXPECT_THROW(detect_launch_env(env), UsageError) << bad;
  }
}

TEST(LaunchEnv, OpenMpiVariables) {
  LaunchEnv e = detect_launch_env({{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "3"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "3"}});
  EXPECT_EQ(e.source, LaunchSource::Mpi);
  EXPECT_EQ(e.rank, 2);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_FALSE(e.store_hosted_by_launcher);
}

TEST(LaunchEnv, MultiHostMpiNeedsMasterAddr) {
  try {
    detect_launch_env({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                       {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("-x MASTER_ADDR"), std::string::npos);
  }
}

TEST(LaunchEnv, SlurmVariables) {
  LaunchEnv e = detect_launch_env({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_JOB_NODELIST", "gpu[07-08]"},
                                   {"SLURM_JOB_ID", "123456"}});
  EXPECT_EQ(e.source, LaunchSource::Slurm);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 20000 + 123456 % 10000);
}

TEST(LaunchEnv, SlurmTasksPerNodeWithRepeat) {
  LaunchEnv e = detect_launch_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "6"}, {"SLURM_TASKS_PER_NODE", "2(x3)"}});
  EXPECT_EQ(e.local_world_size, 2);
}

TEST(LaunchEnv, SlurmTaskLists) {
  EXPECT_EQ(slurm_tasks_on_node("4", 0), 4);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(slurm_tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(slurm_tasks_on_node("2,1", 1), 1);
  EXPECT_THROW(slurm_tasks_on_node("2,1", 5), UsageError);
  LaunchEnv e = detect_launch_env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "3"}, {"SLURM_TASKS_PER_NODE", "2,1"},
                                   {"SLURM_NODEID", "1"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(e.local_world_size, 1);
}

TEST(LaunchEnv, FirstSlurmHost) {
  EXPECT_EQ(first_slurm_host("node1"), "node1");
  EXPECT_EQ(first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(first_slurm_host("node[03-05,9],gpu1"), "node03");
  EXPECT_EQ(first_slurm_host("a[7,9]"), "a7");
}

TEST(LaunchEnv, BadValuesNameTheVariable) {
  auto message = [](const EnvMap& env) {
    try {
      detect_launch_env(env);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"RANK", "4"}, {"WORLD_SIZE", "4"}}).find("RANK=4"), std::string::npos);
  EXPECT_NE(message({{"RANK", "x"}, {"WORLD_SIZE", "4"}}).find("RANK='x'"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0"), std::string::npos);
  EXPECT_NE(message({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT"),
            std::string::npos);
}

TEST(CommError, MessageNamesEverything) {
  CommContext c;
  c.rank = 3;
  c.op = "allreduce(sum)";
  c.group = "world.g0";
  c.group_size = 4;
  c.peer = 1;
  c.step = 17;
  c.timeout = std::chrono::milliseconds(30000);
  CommError e(c, "connection closed", false);
  EXPECT_EQ(std::string(e.what()),
            "[rank 3] allreduce(sum) on group 'world.g0' (4 ranks), peer 1, step 17: connection closed (timeout 30 s)");
}

// CROSSTRAIN_CLUSTER (crosstrain run --cluster) or the testbed's CT_CLUSTER: the node's cluster, for comm.encrypt.
TEST(LaunchEnv, TheNodesClusterFromItsVariable) {
  EXPECT_EQ(detect_launch_env({}).cluster, -1);
  EXPECT_EQ(detect_launch_env({{"CROSSTRAIN_CLUSTER", "2"}}).cluster, 2);
  EXPECT_EQ(detect_launch_env({{"CT_CLUSTER", "1"}}).cluster, 1);
  EXPECT_EQ(detect_launch_env({{"CROSSTRAIN_CLUSTER", "0"}, {"CT_CLUSTER", "1"}}).cluster, 0);
  EXPECT_THROW(detect_launch_env({{"CROSSTRAIN_CLUSTER", "-3"}}), crosstrain::UsageError);
}
