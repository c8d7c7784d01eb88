// How fast this machine multiplies matrices: the one GEMM timer behind the MFU denominator (jobs/gpt/peak_flops.h)
// and the planner's calibration of a host (`crosstrain plan --calibrate`), so that both measure the same way.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>

namespace crosstrain::obs {

// One product as a linear layer runs it: x [m, k] times a weight of k inputs and n outputs, plus a bias when set.
struct GemmShape {
  std::string name;  // what it is in the model ("qkv", "head"), or empty for a shape of a grid
  int64_t m = 0, k = 0, n = 0;
  bool bias = false;
  double flops() const { return 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n); }
  std::string describe() const;  // "qkv 2048x128x384", or "2048x128x384" without a name
};

// FLOP/s of `shape` in `dtype` on the calling thread's intra-op threads: random operands (zeros could take fast
// paths), a warm-up of seconds / 2 that pays for first-call costs (the kernel's choice, packing buffers, page faults
// of the output), then the better of two timed runs of at least `seconds` each, so that a burst of another process
// on the same core does not set the rate. The product writes into one preallocated output: allocation is not GEMM
// work.
double time_gemm(const GemmShape& shape, at::ScalarType dtype, double seconds);

}  // namespace crosstrain::obs
