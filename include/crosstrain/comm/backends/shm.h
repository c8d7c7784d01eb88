// Same-host all-reduce through shared memory, in front of another back end.
//
// Ranks of one host exchange gradients through a POSIX shared-memory segment instead of loopback TCP: each
// rank copies its buffer into its slot, then every rank sums all slots in rank order (so every rank gets the
// bit-identical result). It takes float and double sums and averages; every other operation, and every group
// that spans hosts, goes to the wrapped back end. Operations run in order on one worker thread per group, so
// they stay asynchronous. Waits spin briefly, then sleep on a futex in the segment; all have the timeout.
#pragma once

#include <functional>
#include <memory>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// Collective over `inner`: decides together whether every member is on this host (else returns `inner`
// unchanged) and sets up the segment. `slot_bytes` bounds one round; larger buffers go in several rounds.
// `abandoned`, when given, is asked every ~100 ms while a wait lasts (as is whether every peer still lives): true
// ends the wait with a CommError at once. Elastic training passes "this group's generation has ended", since
// the other members have then left this call and will never arrive.
std::unique_ptr<Communicator> with_shared_memory(std::unique_ptr<Communicator> inner, int64_t slot_bytes = 8 << 20,
                                                 std::function<bool()> abandoned = {});

}  // namespace crosstrain::comm
