// Where this process sits in the job, read from the launcher's environment.
// Understands torchrun's variables (also set by `crosstrain run`), mpirun's (OpenMPI, PMI) and srun's.
// Pure: takes the environment as a map so it can be unit-tested.
#pragma once

#include <map>
#include <string>

namespace crosstrain {

using EnvMap = std::map<std::string, std::string>;

enum class LaunchSource { Single, Torchrun, Mpi, Slurm };

struct LaunchEnv {
  LaunchSource source = LaunchSource::Single;
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // True when the launcher already hosts the rendezvous store (torchrun's TORCHELASTIC_USE_AGENT_STORE);
  // otherwise rank 0 hosts it.
  bool store_hosted_by_launcher = false;
  // The job's name on the rendezvous store: CROSSTRAIN_JOB_ID, else torchrun's TORCHELASTIC_RUN_ID, else the
  // job id of mpirun (OMPI_MCA_ess_base_jobid) or srun (SLURM_JOB_ID.SLURM_STEP_ID), which every rank shares.
  std::string job_id;
  // CROSSTRAIN_SECRET: what every peer of the job must prove it knows (store_auth.h). Never logged.
  std::string secret;
  // CROSSTRAIN_STANDBY=HOST:PORT (crosstrain run --standby): the store an elastic job goes on with when node 0's
  // is lost; empty when there is none.
  std::string standby_addr;
  int standby_port = 0;
  // CROSSTRAIN_CLUSTER (crosstrain run --cluster, the testbed's CT_CLUSTER): this node's cluster, for what keeps
  // traffic inside clusters or seals what leaves them; -1 when not given.
  int cluster = -1;
};

const char* to_string(LaunchSource source);

// The process environment as a map.
EnvMap current_environment();

// Reads the launch environment. Throws UsageError naming the variable when a value is malformed
// or inconsistent (rank >= world size, bad port, ...).
LaunchEnv detect_launch_env(const EnvMap& env);

// "" when `job_id` is usable (1..128 letters, digits and . _ - : @: it goes into store keys and log lines),
// else why not.
std::string job_id_error(const std::string& job_id);

// The first of the variables that name the job, as every rank of one job sees it (LaunchEnv::job_id); "" when
// none is set. Throws UsageError naming the variable when its value is not a usable job id.
std::string detect_job_id(const EnvMap& env);

// Tasks on node `node` of a Slurm task list: "2(x3),1" -> 2 for nodes 0-2, 1 for node 3. Throws UsageError.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

// First host of a Slurm node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace crosstrain
