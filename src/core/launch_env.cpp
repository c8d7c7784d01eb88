#include "crosstrain/core/launch_env.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "crosstrain/core/error.h"

extern char** environ;

namespace crosstrain {
namespace {

const std::string* find(const EnvMap& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() || it->second.empty() ? nullptr : &it->second;
}

int parse_int(const EnvMap& env, const std::string& key, int fallback) {
  const std::string* value = find(env, key);
  if (!value) return fallback;
  // Slurm writes counts like "2(x3)": take the leading number.
  size_t used = 0;
  int result = 0;
  try {
    result = std::stoi(*value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || (used != value->size() && (*value)[used] != '(')) {
    throw UsageError("environment variable " + key + "='" + *value + "' is not an integer");
  }
  return result;
}

std::string get(const EnvMap& env, const std::string& key, const std::string& fallback) {
  const std::string* value = find(env, key);
  return value ? *value : fallback;
}

void validate(const LaunchEnv& e, const char* rank_var, const char* size_var) {
  if (e.world_size < 1)
    throw UsageError(std::string(size_var) + "=" + std::to_string(e.world_size) + " must be at least 1");
  if (e.rank < 0 || e.rank >= e.world_size)
    throw UsageError(std::string(rank_var) + "=" + std::to_string(e.rank) + " is outside 0.." +
                     std::to_string(e.world_size - 1) + " (" + size_var + "=" + std::to_string(e.world_size) + ")");
  if (e.local_world_size < 1 || e.local_rank < 0 || e.local_rank >= e.local_world_size)
    throw UsageError("local rank " + std::to_string(e.local_rank) + " is outside the local world of " +
                     std::to_string(e.local_world_size));
  if (e.master_port < 1 || e.master_port > 65535)
    throw UsageError("MASTER_PORT=" + std::to_string(e.master_port) + " is not a TCP port (1..65535)");
}

// "HOST:PORT", as crosstrain run writes it for its ranks.
void read_standby(const std::string& text, LaunchEnv& e) {
  const auto colon = text.rfind(':');
  const std::string port = colon == std::string::npos ? "" : text.substr(colon + 1);
  int value = 0;
  size_t used = 0;
  try {
    value = std::stoi(port, &used);
  } catch (const std::exception&) {
  }
  if (colon == 0 || colon == std::string::npos || used != port.size() || value < 1 || value > 65535)
    throw UsageError("CROSSTRAIN_STANDBY='" + text.substr(0, 80) + "' must be HOST:PORT (crosstrain run --standby sets it)");
  e.standby_addr = text.substr(0, colon);
  e.standby_port = value;
}

}  // namespace

const char* to_string(LaunchSource source) {
  switch (source) {
    case LaunchSource::Single: return "single process";
    case LaunchSource::Torchrun: return "torchrun variables";
    case LaunchSource::Mpi: return "mpirun";
    case LaunchSource::Slurm: return "srun";
  }
  return "?";
}

EnvMap current_environment() {
  EnvMap env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

std::string first_slurm_host(const std::string& nodelist) {
  // A list is comma separated, but commas also appear inside brackets: "a[1-2,5],b".
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    if (nodelist[end] == '[') ++depth;
    if (nodelist[end] == ']') --depth;
    if (nodelist[end] == ',' && depth == 0) break;
  }
  std::string first = nodelist.substr(0, end);
  auto open = first.find('[');
  if (open == std::string::npos) return first;
  std::string prefix = first.substr(0, open);
  std::string range = first.substr(open + 1);
  auto stop = range.find_first_of("-,]");
  return prefix + range.substr(0, stop);
}

int slurm_tasks_on_node(const std::string& tasks_per_node, int node) {
  // "2(x3),1": two tasks on each of three nodes, then one.
  int index = 0;
  size_t pos = 0;
  while (pos < tasks_per_node.size()) {
    size_t end = tasks_per_node.find(',', pos);
    if (end == std::string::npos) end = tasks_per_node.size();
    const std::string item = tasks_per_node.substr(pos, end - pos);
    int count = 0, repeat = 1;
    if (std::sscanf(item.c_str(), "%d(x%d)", &count, &repeat) < 1)
      throw UsageError("SLURM_TASKS_PER_NODE='" + tasks_per_node + "' is not a Slurm task list");
    if (node < index + repeat) return count;
    index += repeat;
    pos = end + 1;
  }
  throw UsageError("SLURM_TASKS_PER_NODE='" + tasks_per_node + "' has no entry for node " + std::to_string(node));
}

std::string job_id_error(const std::string& job_id) {
  constexpr size_t kMaxJobIdBytes = 128;
  if (job_id.empty()) return "a job id cannot be empty";
  if (job_id.size() > kMaxJobIdBytes)
    return "a job id of " + std::to_string(job_id.size()) + " characters is longer than " +
           std::to_string(kMaxJobIdBytes);
  for (char ch : job_id) {
    const bool ok = std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '_' || ch == '-' ||
                    ch == ':' || ch == '@';
    if (!ok) return "job id '" + job_id + "' may hold only letters, digits and . _ - : @";
  }
  return "";
}

std::string detect_job_id(const EnvMap& env) {
  for (const char* var : {"CROSSTRAIN_JOB_ID", "TORCHELASTIC_RUN_ID", "OMPI_MCA_ess_base_jobid"}) {
    if (const std::string* id = find(env, var)) {
      const std::string problem = job_id_error(*id);
      if (!problem.empty()) throw UsageError(std::string(var) + ": " + problem);
      return *id;
    }
  }
  if (const std::string* slurm = find(env, "SLURM_JOB_ID"))
    return "slurm-" + *slurm + "." + get(env, "SLURM_STEP_ID", "0");
  return "";
}

LaunchEnv detect_launch_env(const EnvMap& env) {
  LaunchEnv e;
  e.master_addr = get(env, "MASTER_ADDR", "127.0.0.1");
  e.master_port = parse_int(env, "MASTER_PORT", 29500);
  e.job_id = detect_job_id(env);
  e.secret = get(env, "CROSSTRAIN_SECRET", "");
  if (const std::string* standby = find(env, "CROSSTRAIN_STANDBY")) read_standby(*standby, e);
  for (const char* name : {"CROSSTRAIN_CLUSTER", "CT_CLUSTER"})
    if (find(env, name)) {
      e.cluster = parse_int(env, name, -1);
      if (e.cluster < 0) throw UsageError(std::string(name) + " must be a cluster number (0, 1, ...)");
      break;
    }

  if (find(env, "RANK") && find(env, "WORLD_SIZE")) {
    e.source = LaunchSource::Torchrun;
    e.rank = parse_int(env, "RANK", 0);
    e.world_size = parse_int(env, "WORLD_SIZE", 1);
    e.local_rank = parse_int(env, "LOCAL_RANK", e.rank);
    e.local_world_size = parse_int(env, "LOCAL_WORLD_SIZE", e.world_size);
    std::string hosted = get(env, "TORCHELASTIC_USE_AGENT_STORE", "");
    e.store_hosted_by_launcher = hosted == "True" || hosted == "true" || hosted == "1";
    validate(e, "RANK", "WORLD_SIZE");
    return e;
  }
  if (find(env, "OMPI_COMM_WORLD_RANK") || find(env, "PMI_RANK")) {
    e.source = LaunchSource::Mpi;
    bool ompi = find(env, "OMPI_COMM_WORLD_RANK") != nullptr;
    const char* rank_var = ompi ? "OMPI_COMM_WORLD_RANK" : "PMI_RANK";
    const char* size_var = ompi ? "OMPI_COMM_WORLD_SIZE" : "PMI_SIZE";
    e.rank = parse_int(env, rank_var, 0);
    e.world_size = parse_int(env, size_var, 1);
    e.local_rank = parse_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_RANK" : "MPI_LOCALRANKID", e.rank);
    e.local_world_size = parse_int(env, ompi ? "OMPI_COMM_WORLD_LOCAL_SIZE" : "MPI_LOCALNRANKS", e.world_size);
    if (e.local_world_size != e.world_size && !find(env, "MASTER_ADDR"))
      throw UsageError("mpirun spans several hosts but MASTER_ADDR is not set; pass it with "
                       "`mpirun -x MASTER_ADDR=<host of rank 0> -x MASTER_PORT=<port> ...`");
    validate(e, rank_var, size_var);
    return e;
  }
  if (find(env, "SLURM_PROCID") && find(env, "SLURM_NTASKS")) {
    e.source = LaunchSource::Slurm;
    e.rank = parse_int(env, "SLURM_PROCID", 0);
    e.world_size = parse_int(env, "SLURM_NTASKS", 1);
    e.local_rank = parse_int(env, "SLURM_LOCALID", 0);
    if (find(env, "SLURM_NTASKS_PER_NODE"))
      e.local_world_size = parse_int(env, "SLURM_NTASKS_PER_NODE", 1);
    else if (const std::string* tasks = find(env, "SLURM_TASKS_PER_NODE"))
      e.local_world_size = slurm_tasks_on_node(*tasks, parse_int(env, "SLURM_NODEID", 0));
    if (!find(env, "MASTER_ADDR")) {
      std::string nodes = get(env, "SLURM_STEP_NODELIST", get(env, "SLURM_JOB_NODELIST", ""));
      if (!nodes.empty()) e.master_addr = first_slurm_host(nodes);
    }
    // Jobs sharing a node must not share a port: derive one from the job id, as Lightning does.
    if (!find(env, "MASTER_PORT") && find(env, "SLURM_JOB_ID"))
      e.master_port = 20000 + parse_int(env, "SLURM_JOB_ID", 0) % 10000;
    validate(e, "SLURM_PROCID", "SLURM_NTASKS");
    return e;
  }
  validate(e, "RANK", "WORLD_SIZE");
  return e;
}

}  // namespace crosstrain
