#include "launch_limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <vector>
#include <cstdio>
#include <fstream>
#include <string>

#include "crosstrain/core/error.h"
#include "crosstrain/core/machine.h"

namespace crosstrain::apps {
namespace {

int64_t read_number(const char* path) {
  std::ifstream in(path);
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// The folders of this process's cgroup for `controller`, from its own up to the root: cgroup v1's hierarchy of
// that controller if it has one, else the unified (v2) one. Every level's limit applies.
std::vector<std::filesystem::path> cgroup_chain(const std::string& controller) {
  std::ifstream in("/proc/self/cgroup");
  std::string v1_path, v2_path;
  for (std::string line; std::getline(in, line);) {  // "ID:controller,controller:/path"
    const auto a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = "," + line.substr(a + 1, b - a - 1) + ",";
    if (controllers.find("," + controller + ",") != std::string::npos) v1_path = line.substr(b + 1);
    if (line.compare(0, a, "0") == 0 && b == a + 1) v2_path = line.substr(b + 1);
  }
  std::filesystem::path base = "/sys/fs/cgroup/" + controller;
  std::string path = v1_path;
  if (v1_path.empty()) {
    path = v2_path;
    base = std::filesystem::exists("/sys/fs/cgroup/unified/cgroup.controllers") ? "/sys/fs/cgroup/unified"
                                                                               : "/sys/fs/cgroup";
  }
  std::vector<std::filesystem::path> chain;
  if (path.empty()) return chain;
  for (std::filesystem::path p = path;; p = p.parent_path()) {
    chain.push_back(base / p.relative_path());
    if (!p.has_relative_path()) break;
  }
  return chain;
}

// The least room left at any level of the chain (limit minus usage); -1 when no level sets a limit.
int64_t cgroup_room(const std::string& controller, const char* limit_file, const char* usage_file) {
  int64_t room = -1;
  for (const auto& dir : cgroup_chain(controller)) {
    const int64_t limit = read_number((dir / limit_file).c_str()), used = read_number((dir / usage_file).c_str());
    if (limit <= 0 || limit >= (int64_t{1} << 60) || used < 0) continue;  // "max", or v1's "unlimited"
    const int64_t left = std::max<int64_t>(0, limit - used);
    if (room < 0 || left < room) room = left;
  }
  return room;
}

int64_t cgroup_memory_room() {
  const int64_t v1 = cgroup_room("memory", "memory.limit_in_bytes", "memory.usage_in_bytes");
  return v1 >= 0 ? v1 : cgroup_room("memory", "memory.max", "memory.current");
}

// Tasks (threads) of the whole machine, and of the processes whose real uid is `uid`.
void count_tasks(uid_t uid, int64_t& all, int64_t& mine) {
  all = mine = 0;
  DIR* proc = opendir("/proc");
  if (!proc) return;
  while (dirent* e = readdir(proc)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    std::ifstream status(std::string("/proc/") + e->d_name + "/status");
    int64_t threads = 0;
    long real_uid = -1;
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("Uid:", 0) == 0) std::sscanf(line.c_str() + 4, "%ld", &real_uid);
      if (line.rfind("Threads:", 0) == 0) threads = std::stoll(line.substr(8));
    }
    all += threads;
    if (real_uid == static_cast<long>(uid)) mine += threads;
  }
  closedir(proc);
}

std::string gib(int64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1LL << 30));
  return text;
}

std::string mib(int64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

std::string advice(int64_t fits, const char* otherwise) {
  return fits > 0 ? "use at most --nproc " + std::to_string(fits) : std::string(otherwise);
}

}  // namespace

MachineRoom read_machine_room() {
  MachineRoom room;
  room.available_bytes = available_memory_bytes();
  const int64_t cgroup = cgroup_memory_room();
  if (cgroup >= 0 && (room.available_bytes < 0 || cgroup < room.available_bytes)) room.available_bytes = cgroup;

  int64_t all = 0, mine = 0;
  count_tasks(getuid(), all, mine);
  const int64_t threads_max = read_number("/proc/sys/kernel/threads-max");
  const int64_t pid_max = read_number("/proc/sys/kernel/pid_max");
  int64_t system = -1;
  if (threads_max > 0) system = threads_max;
  if (pid_max > 0 && (system < 0 || pid_max < system)) system = pid_max;
  if (system > 0) {
    room.free_tasks = std::max<int64_t>(0, system - all);
    room.task_limit = "the system's process limit (kernel.threads-max, kernel.pid_max)";
  }
  // A pids cgroup (containers set one) limits root too.
  const int64_t pids = cgroup_room("pids", "pids.max", "pids.current");
  if (pids >= 0 && (room.free_tasks < 0 || pids < room.free_tasks)) {
    room.free_tasks = pids;
    room.task_limit = "the pids limit of this cgroup (a container's process limit)";
  }
  // RLIMIT_NPROC counts this user's tasks; the kernel does not apply it to root.
  rlimit nproc{};
  if (getuid() != 0 && getrlimit(RLIMIT_NPROC, &nproc) == 0 && nproc.rlim_cur != RLIM_INFINITY) {
    const int64_t user_room = std::max<int64_t>(0, static_cast<int64_t>(nproc.rlim_cur) - mine);
    if (room.free_tasks < 0 || user_room < room.free_tasks) {
      room.free_tasks = user_room;
      room.task_limit = "this user's process limit (ulimit -u)";
    }
  }
  return room;
}

void check_ranks_fit(int nproc, const RankNeeds& needs, const MachineRoom& room, int launcher_tasks) {
  const std::string n = std::to_string(nproc);
  const int64_t tasks = int64_t{nproc} * needs.tasks + launcher_tasks;
  if (room.free_tasks >= 0 && tasks > room.free_tasks) {
    const std::string launcher =
        launcher_tasks > 0 ? " with the launcher's rendezvous store threads, and " + std::to_string(launcher_tasks) +
                                 " more for the launcher"
                           : "";
    throw UsageError("--nproc " + n + " needs at least " + std::to_string(tasks) + " processes and threads (" +
                     std::to_string(needs.tasks) + " per rank" + launcher + "), but " + room.task_limit +
                     " leaves room for " + std::to_string(room.free_tasks) + "; " +
                     advice((room.free_tasks - launcher_tasks) / needs.tasks, "end other processes or raise the limit"));
  }
  if (room.available_bytes >= 0 && static_cast<int64_t>(nproc) * needs.bytes > room.available_bytes)
    throw UsageError("--nproc " + n + " needs at least " + gib(int64_t{nproc} * needs.bytes) + " of memory (" +
                     mib(needs.bytes) + " per rank), but " + gib(room.available_bytes) +
                     " is available; " + advice(room.available_bytes / needs.bytes, "free some memory first"));
}

}  // namespace crosstrain::apps
