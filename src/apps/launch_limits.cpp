#include "launch_limits.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::apps {
namespace {

int64_t read_number(const char* path) {
  std::ifstream in(path);
  int64_t value = -1;
  if (!(in >> value)) return -1;
  return value;
}

// "MemAvailable:   24196348 kB" -> bytes.
int64_t mem_available() {
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    int64_t kib = 0;
    std::string unit;
    in >> kib >> unit;
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

// Headroom of this process's memory cgroup (v2 or v1), -1 when unlimited or unknown.
int64_t cgroup_memory_room() {
  const int64_t v2_max = read_number("/sys/fs/cgroup/memory.max"), v2_used = read_number("/sys/fs/cgroup/memory.current");
  if (v2_max > 0 && v2_used >= 0) return std::max<int64_t>(0, v2_max - v2_used);
  const int64_t v1_max = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes");
  const int64_t v1_used = read_number("/sys/fs/cgroup/memory/memory.usage_in_bytes");
  if (v1_max > 0 && v1_max < (int64_t{1} << 60) && v1_used >= 0) return std::max<int64_t>(0, v1_max - v1_used);
  return -1;
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
  room.available_bytes = mem_available();
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

void check_ranks_fit(int nproc, const RankNeeds& needs, const MachineRoom& room) {
  const std::string n = std::to_string(nproc);
  if (room.free_tasks >= 0 && static_cast<int64_t>(nproc) * needs.tasks > room.free_tasks)
    throw UsageError("--nproc " + n + " needs at least " + std::to_string(int64_t{nproc} * needs.tasks) +
                     " processes and threads (" + std::to_string(needs.tasks) + " per rank), but " +
                     room.task_limit + " leaves room for " + std::to_string(room.free_tasks) +
                     "; " + advice(room.free_tasks / needs.tasks, "end other processes or raise the limit"));
  if (room.available_bytes >= 0 && static_cast<int64_t>(nproc) * needs.bytes > room.available_bytes)
    throw UsageError("--nproc " + n + " needs at least " + gib(int64_t{nproc} * needs.bytes) + " of memory (" +
                     mib(needs.bytes) + " per rank), but " + gib(room.available_bytes) +
                     " is available; " + advice(room.available_bytes / needs.bytes, "free some memory first"));
}

}  // namespace crosstrain::apps
