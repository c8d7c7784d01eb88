// How this rank's monotonic clock relates to rank 0's, for traces that line up across machines: Cristian's
// method, a few ping-pongs with rank 0, the sample with the smallest round trip wins.
#pragma once

#include <cstdint>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

struct ClockOffset {
  int64_t offset_us = 0;  // rank 0's clock = this rank's + offset_us
  int64_t rtt_us = 0;     // the round trip of the sample used (the offset's error is at most half of it)
};

// Collective over `world` (point to point with rank 0, which serves every rank at once). Rank 0 gets {0, 0}.
ClockOffset estimate_clock_offset(Communicator& world, int rounds = 8);

}  // namespace crosstrain::comm
