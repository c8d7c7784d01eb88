#include "crosstrain/comm/diagnostics/clock_sync.h"

#include <ATen/ATen.h>

#include <limits>
#include <vector>

#include "crosstrain/comm/diagnostics/flight_recorder.h"

namespace crosstrain::comm {

ClockOffset estimate_clock_offset(Communicator& world, int rounds) {
  constexpr int kTag = 7341;  // apart from the tags of training traffic
  at::Tensor ping = at::zeros({1}, at::kLong), pong = at::zeros({1}, at::kLong);
  if (world.rank() == 0) {
    // Every rank pings at once, round after round, and each ping is answered with this clock's reading as soon as
    // it is read: serving the ranks one after the other cost rounds x ranks round trips, seconds across a
    // wide-area link (an elastic generation set up its trace this way each time).
    const int peers = world.size() - 1;
    for (int i = 0; i < rounds; ++i) {
      std::vector<at::Tensor> pings, pongs;
      std::vector<WorkPtr> recvs, sends;
      for (int peer = 1; peer <= peers; ++peer) {
        pings.push_back(at::zeros({1}, at::kLong));
        pongs.push_back(at::zeros({1}, at::kLong));
        recvs.push_back(world.recv(pings.back(), peer, kTag));
      }
      for (int p = 0; p < peers; ++p) {
        recvs[p]->wait();
        pongs[p].fill_(monotonic_us());
        sends.push_back(world.send(pongs[p], p + 1, kTag));
      }
      wait_all(sends);
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
