// Bytes of CPU tensor memory in use, counted at the allocator (not RSS): what the saved activations of a graph
// really occupy, free of the heap's and the libraries' noise. Installing wraps libtorch's CPU allocator for the
// whole process (the allocator is process-wide by nature); tensors allocated before are not counted.
//
//   install_memory_counter();
//   MemoryWatermark w;            // baseline: the bytes in use now
//   ... forward, backward ...
//   w.peak_above_baseline();      // the most bytes in use above the baseline since w began
#pragma once

#include <cstdint>

namespace crosstrain {

// Idempotent. Afterwards every CPU tensor allocation is counted.
void install_memory_counter();
bool memory_counter_installed();
// Bytes of counted allocations alive now.
int64_t counted_bytes_in_use();

// The peak of counted bytes in use since construction (or the last reset), above the bytes in use then.
// One watermark at a time per process (the counter keeps one peak).
class MemoryWatermark {
 public:
  MemoryWatermark();
  void reset();
  int64_t baseline() const { return baseline_; }
  int64_t peak_above_baseline() const;

 private:
  int64_t baseline_ = 0;
};

}  // namespace crosstrain
