// Same-host all-reduce through shared memory, in front of another back end.
//
// Ranks of one host exchange gradients through a POSIX shared-memory segment instead of loopback TCP: each
// rank copies its buffer into its slot, then every rank sums all slots in rank order (so every rank gets the
// bit-identical result). It takes float and double sums and averages; every other operation, and every group
// that spans hosts, goes to the wrapped back end. Operations run in order on one worker thread per group, so
// they stay asynchronous. Waits spin briefly, then sleep on a futex in the segment; all have the timeout.
#pragma once

#include <memory>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// Collective over `inner`: decides together whether every member is on this host (else returns `inner`
// unchanged) and sets up the segment. `slot_bytes` bounds one round; larger buffers go in several rounds.
std::unique_ptr<Communicator> with_shared_memory(std::unique_ptr<Communicator> inner, int64_t slot_bytes = 8 << 20);

}  // namespace crosstrain::comm
