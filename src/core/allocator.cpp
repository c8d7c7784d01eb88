#include "crosstrain/core/allocator.h"

#include <malloc.h>

namespace crosstrain {

void keep_freed_memory_for_reuse() {
  // 32 MiB is glibc's largest mmap threshold; above it blocks are still mapped (and returned) directly.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

void return_freed_memory() { malloc_trim(0); }

}  // namespace crosstrain
