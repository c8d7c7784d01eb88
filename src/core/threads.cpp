#include "crosstrain/core/threads.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>

namespace crosstrain {

void limit_compute_threads(int threads) {
  at::set_num_threads(threads);
  // OpenBLAS is found at run time: libtorch may be linked against another BLAS.
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) set(threads);
}

}  // namespace crosstrain
