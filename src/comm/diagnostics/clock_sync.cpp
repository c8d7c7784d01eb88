#include "crosstrain/comm/diagnostics/clock_sync.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <thread>
#include <vector>

#include "crosstrain/comm/diagnostics/flight_recorder.h"

namespace crosstrain::comm {

ClockOffset estimate_clock_offset(Communicator& world, int rounds) {
  constexpr int kTag = 7341;  // apart from the tags of training traffic
  at::Tensor ping = at::zeros({1}, at::kLong), pong = at::zeros({1}, at::kLong);
  if (world.rank() == 0) {
    // Each rank is served on a thread of its own (at most kServers at once), which answers each ping with this
    // clock's reading as soon as it arrives. Serving the ranks one after the other cost rounds x ranks round trips,
    // seconds across a wide-area link (an elastic generation sets up its trace each time); one thread answering
    // pings in a fixed order stamped some late, which a loaded machine turned into offsets off by milliseconds.
    constexpr int kServers = 64;
    const int peers = world.size() - 1, servers = std::min(peers, kServers);
    std::vector<std::exception_ptr> errors(servers);
    std::vector<std::thread> threads;
    for (int t = 0; t < servers; ++t)
      threads.emplace_back([&, t] {
        try {
          at::Tensor in = at::zeros({1}, at::kLong), out = at::zeros({1}, at::kLong);
          for (int peer = 1 + t; peer <= peers; peer += servers)
            for (int i = 0; i < rounds; ++i) {
              world.recv(in, peer, kTag)->wait();
              out.fill_(monotonic_us());
              world.send(out, peer, kTag)->wait();
            }
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    for (auto& thread : threads) thread.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    return {};
  }
  ClockOffset best;
  best.rtt_us = std::numeric_limits<int64_t>::max();
  for (int i = 0; i < rounds; ++i) {
    const int64_t sent = monotonic_us();
    world.send(ping, 0, kTag)->wait();
    world.recv(pong, 0, kTag)->wait();
    const int64_t received = monotonic_us();
    const int64_t rtt = received - sent;
    if (rtt < best.rtt_us) {
      best.rtt_us = rtt;
      best.offset_us = pong.item<int64_t>() - (sent + received) / 2;
    }
  }
  return best;
}

}  // namespace crosstrain::comm
