// Will N ranks fit this machine? Checked by the launcher before it starts anything, so that a --nproc that cannot
// fit is refused with the figures instead of failing part-way (a fork that fails, ranks killed for memory).
#pragma once

#include <cstdint>

namespace crosstrain::apps {

// What a rank needs at the least (a lower bound: the check refuses only what certainly cannot fit).
struct RankNeeds {
  int64_t bytes = 4 << 20;  // resident memory of one rank
  int tasks = 1;            // processes and threads of one rank (they count against the process limits)
};

// This machine's room for more processes and memory, as the kernel will enforce it.
struct MachineRoom {
  int64_t available_bytes = -1;  // MemAvailable (and the memory cgroup's headroom, if lower); -1: unknown
  int64_t free_tasks = -1;       // tasks this user may still start (RLIMIT_NPROC, threads-max, pid_max); -1: unknown
  const char* task_limit = "";   // which limit free_tasks comes from, for the message
};

MachineRoom read_machine_room();

// Throws UsageError naming the figures when `nproc` ranks of `needs`, and `launcher_tasks` threads the launcher
// adds itself, cannot fit `room`.
void check_ranks_fit(int nproc, const RankNeeds& needs, const MachineRoom& room, int launcher_tasks = 0);

// A crosstrain rank: libtorch and its thread pools, before any model (measured: 270 MB and 8 threads for gpt-tiny).
constexpr RankNeeds kCrosstrainRank{150LL << 20, 6};

}  // namespace crosstrain::apps
