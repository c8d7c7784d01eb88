#include "demo_comm.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "crosstrain/comm/init.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/threads.h"
#include "launcher.h"

namespace crosstrain::apps {

int demo_comm(int nproc, const std::vector<std::string>& relaunch_args) {
  LaunchEnv env = detect_launch_env(current_environment());
  if (env.source == LaunchSource::Single && nproc > 1) return launch_self(nproc, relaunch_args);
  limit_compute_threads(1);
  auto world = comm::init_world(env, comm::CommConfig{});
  comm::Communicator& c = *world;
  const int n = c.size(), r = c.rank();
  auto say = [&](const std::string& text) {
    if (r == 0) std::printf("%s\n", text.c_str());
    std::fflush(stdout);
  };
  say("crosstrain demo: " + std::to_string(n) + " ranks joined over " + c.backend() + " (" + to_string(env.source) + ")");

  // Every rank contributes rank+1: the sum is n(n+1)/2 everywhere.
  at::Tensor x = at::full({4}, static_cast<float>(r + 1));
  c.all_reduce(x, comm::ReduceOp::Sum)->wait();
  say("all-reduce(sum) of rank+1      -> " + std::to_string(x[0].item<float>()) + " (expected " +
      std::to_string(n * (n + 1) / 2.0) + ")");

  at::Tensor pids = at::zeros({n}, at::kLong);
  c.all_gather(at::full({1}, static_cast<int64_t>(getpid()), at::kLong), pids)->wait();
  std::string list;
  for (int i = 0; i < n; ++i) list += (i ? ", " : "") + std::to_string(pids[i].item<int64_t>());
  say("all-gather of process ids      -> [" + list + "]");

  // Ping-pong between ranks 0 and 1: the round trip of a small message over the back end.
  if (n >= 2 && r < 2) {
    at::Tensor msg = at::zeros({1});
    const int rounds = 200;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < rounds; ++i) {
      if (r == 0) {
        c.send(msg, 1, 1)->wait();
        c.recv(msg, 1, 2)->wait();
      } else {
        c.recv(msg, 0, 1)->wait();
        msg.add_(1);
        c.send(msg, 0, 2)->wait();
      }
    }
    double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / rounds;
    if (r == 0)
      std::printf("send/recv ping-pong 0 <-> 1     -> %.1f us per round trip, counter %d (expected %d)\n", us,
                  static_cast<int>(msg.item<float>()), rounds);
  }

  at::Tensor big = at::ones({4 << 20});  // 16 MiB
  c.barrier()->wait();
  auto t0 = std::chrono::steady_clock::now();
  c.all_reduce(big, comm::ReduceOp::Avg)->wait();
  double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char line[160];
  std::snprintf(line, sizeof line, "all-reduce(avg) of 16 MiB       -> %.1f ms (%.2f GB/s algbw), value %.1f", ms,
                (16.0 * (1 << 20)) / (ms * 1e-3) / 1e9, big[0].item<float>());
  say(line);
  c.barrier()->wait();
  say("done; `crosstrain bench comm --op all --nproc 2` measures every collective");
  return 0;
}

}  // namespace crosstrain::apps
