// Our collective algorithms over a real back end (Gloo unless CT_BACKEND says otherwise), one process per rank:
//   crosstrain run --nproc N -- algorithm_worker
// Every algorithm and every hierarchical group size that divides N, every collective, against reduce_reference.
// Exits 1 listing the failures; CT_TIMEOUT_MS sets the timeout.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "algorithm_checks.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"

using namespace crosstrain;

int main() {
  limit_compute_threads(1);
  try {
    LaunchEnv env = detect_launch_env(current_environment());
    comm::CommConfig config;
    config.shared_memory = false;  // the algorithms run on send/recv
    if (const char* t = std::getenv("CT_TIMEOUT_MS")) config.timeout_s = std::atoi(t) / 1000.0;
    if (const char* b = std::getenv("CT_BACKEND")) config.backend = b;
    auto world = comm::init_world(env, config);
    comm::Communicator& c = *world;
    testing::AlgorithmCheckOptions options;
    options.sizes = {0, 1, 7, 1027};
    options.large = 65537;
    size_t failed = 0;
    for (auto a : {comm::algo::Algorithm::Ring, comm::algo::Algorithm::Tree, comm::algo::Algorithm::HalvingDoubling,
                   comm::algo::Algorithm::Hierarchical, comm::algo::Algorithm::Builtin})
      for (const auto& v : testing::algorithm_variants(a, c.size())) {
        auto failures = testing::check_algorithm(c, v, options);
        for (const auto& f : failures) std::cerr << "FAIL " << f << "\n";
        failed += failures.size();
        if (c.rank() == 0) std::printf("%s: %s\n", v.name().c_str(), failures.empty() ? "ok" : "FAILED");
      }
    if (failed) return 1;
    if (c.rank() == 0) std::printf("algorithms passed on %d ranks\n", c.size());
    return 0;
  } catch (const CommError& e) {
    std::cerr << "CommError: " << e.what() << std::endl;
    std::fflush(nullptr);
    _exit(3);  // do not wait for a broken group's threads
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 4;
  }
}
