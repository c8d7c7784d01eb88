// A rank program for the multi-process tests. Modes:
//   conformance  run the whole collective suite over Gloo
//   env          print the detected launch environment, then all-reduce once
//   die          rank 1 SIGKILLs itself in the middle of a series of all-reduces
//   hang         rank 1 stops participating (sleeps); the others must time out
// The others report the CommError they got and exit 3; CT_TIMEOUT_MS sets the timeout.
#include <ATen/ATen.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "conformance.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/comm/secure/encryption.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"

using namespace crosstrain;

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "conformance";
  limit_compute_threads(1);
  try {
    LaunchEnv env = detect_launch_env(current_environment());
    comm::CommConfig config;
    if (const char* t = std::getenv("CT_TIMEOUT_MS")) config.timeout_s = std::atoi(t) / 1000.0;
    if (const char* b = std::getenv("CT_BACKEND")) config.backend = b;
    if (const char* e = std::getenv("CT_ENCRYPT")) config.encrypt = e;
    auto world = comm::init_world(env, config);
    comm::Communicator& c = *world;
    if (mode == "conformance") {
      testing::ConformanceOptions options;
      auto failures = testing::run_conformance(c, options);
      for (const auto& f : failures) std::cerr << "FAIL " << f << "\n";
      if (!failures.empty()) return 1;
      if (c.rank() == 0)
        std::printf("conformance passed on %d ranks%s\n", c.size(), comm::is_encrypted(c) ? " (sealed)" : "");
      return 0;
    }
    if (mode == "env") {
      at::Tensor t = at::ones({5});
      c.all_reduce(t, comm::ReduceOp::Sum)->wait();
      std::printf("source=%s rank=%d world=%d local_rank=%d local_world=%d master=%s:%d sum=%g\n",
                  to_string(env.source), env.rank, env.world_size, env.local_rank, env.local_world_size,
                  env.master_addr.c_str(), env.master_port, t[0].item<double>());
      return 0;
    }
    if (mode == "die" || mode == "hang") {
      // Tests wait for this line instead of guessing how long joining takes on a loaded machine.
      std::printf("rank %d joined\n", c.rank());
      std::fflush(stdout);
      at::Tensor t = at::ones({1 << 16});
      for (int step = 0; step < 1000; ++step) {
        c.set_step(step);
        if (step == 5 && c.rank() == 1) {
          if (mode == "die") raise(SIGKILL);
          sleep(600);
        }
        c.all_reduce(t, comm::ReduceOp::Avg)->wait();
      }
      std::printf("rank %d finished without noticing the failure\n", c.rank());
      return 0;
    }
    std::cerr << "unknown mode " << mode << "\n";
    return 2;
  } catch (const CommError& e) {
    std::cerr << std::string("CommError: ") + e.what() + "\n" << std::flush;  // one write: no bare prefix if stopped
    std::fflush(nullptr);
    _exit(3);  // do not wait for a broken group's threads
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 4;
  }
}
