#pragma once

namespace crosstrain {

// Limits this process to `threads` compute threads: libtorch's intra-op pool and OpenBLAS (which ignores
// libtorch's setting). Two ranks per core is the most that pays on small machines.
void limit_compute_threads(int threads);

}  // namespace crosstrain
