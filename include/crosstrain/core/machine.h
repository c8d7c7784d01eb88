// Facts about the machine this process runs on, read where the kernel publishes them.
#pragma once

#include <cstdint>

namespace crosstrain {

// Bytes of memory the system can still hand out without swapping (MemAvailable in /proc/meminfo), or -1
// when that cannot be read (not Linux, an old kernel): callers then skip their memory checks.
int64_t available_memory_bytes();

// The cores this process may run on (its CPU affinity, which a container or taskset narrows), at least 1.
int usable_cores();

}  // namespace crosstrain
