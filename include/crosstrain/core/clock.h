// The clock of traces and flight records: microseconds of the monotonic clock, the same in every process of a
// machine (CLOCK_MONOTONIC), so that spans of one host line up without any offset.
#pragma once

#include <chrono>
#include <cstdint>

namespace crosstrain {

inline int64_t monotonic_us() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace crosstrain
