#pragma once

namespace crosstrain {

// Keeps freed tensor memory in the process heap instead of returning it to the kernel after every step.
// glibc maps large blocks with mmap and trims the heap eagerly; a training step frees and reallocates the
// same activations each step, and each round trip costs page faults and zeroing (about 5% of a CPU step
// here). Applies to this process; call once at start.
void keep_freed_memory_for_reuse();

}  // namespace crosstrain
