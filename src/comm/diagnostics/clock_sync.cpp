#include "crosstrain/comm/diagnostics/clock_sync.h"

#include <ATen/ATen.h>

#include <limits>

#include "crosstrain/comm/diagnostics/flight_recorder.h"

namespace crosstrain::comm {

ClockOffset estimate_clock_offset(Communicator& world, int rounds) {
  constexpr int kTag = 7341;  // apart from the tags of training traffic
  at::Tensor ping = at::zeros({1}, at::kLong), pong = at::zeros({1}, at::kLong);
  if (world.rank() == 0) {
    // Serve each rank in turn: receive its ping, answer with this clock's reading.
    for (int peer = 1; peer < world.size(); ++peer)
      for (int i = 0; i < rounds; ++i) {
        world.recv(ping, peer, kTag)->wait();
        pong.fill_(monotonic_us());
        world.send(pong, peer, kTag)->wait();
      }
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
