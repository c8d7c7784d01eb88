#pragma once

namespace crosstrain {

// Keeps freed tensor memory in the process heap instead of returning it to the kernel after every step.
// glibc maps large blocks with mmap and trims the heap eagerly; a training step frees and reallocates the
// same activations each step, and each round trip costs page faults and zeroing (about 5% of a CPU step
// here). Applies to this process; call once at start.
void keep_freed_memory_for_reuse();

// Hands the heap's free pages back to the kernel now (malloc_trim), so that RSS read right after counts only
// live memory: a baseline taken while freed memory is still mapped would hide the growth after it.
void return_freed_memory();

}  // namespace crosstrain
