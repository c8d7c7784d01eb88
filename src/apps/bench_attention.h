// `crosstrain bench attention`: forward + backward of the fused causal attention (models/fused_attention.h)
// against the dense reference path (matmul, mask, softmax, matmul) at several sequence lengths.
#pragma once

#include <cstdint>
#include <vector>

namespace crosstrain::apps {

struct BenchAttentionOptions {
  std::vector<int64_t> lengths{128, 512, 1024, 2048};
  int64_t batch = 1, heads = 8, head_dim = 64;
  int repeat = 7;   // timed repetitions per path and length; the table shows medians
  int threads = 1;  // compute threads (libtorch's pool and OpenBLAS), as a rank runs
};

// Prints a table and one `T=... reference_ms=... fused_ms=... speedup=...` line per length. Returns the exit code.
int bench_attention(const BenchAttentionOptions& options);

}  // namespace crosstrain::apps
