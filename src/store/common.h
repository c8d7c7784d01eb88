// What the store's two c10d::Store faces share (StoreClient over a socket, LocalStore in the hosting process):
// c10d's byte vectors as the table's strings, and the one CommError they throw, so that both name the
// operation, the store's address and the rank in the same words. Internal to src/comm.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::store {

inline std::string text(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }
inline std::vector<uint8_t> bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

// Throws "[rank R] rendezvous: <what> on the store at <address>: <cause>". Only a timed-out operation carries
// the timeout: after a refusal, "(timeout N s)" would send the user looking for a slow peer.
[[noreturn]] inline void fail_store_op(int rank, std::chrono::milliseconds timeout, const std::string& what,
                                       const std::string& address, const std::string& cause, bool timed_out) {
  CommContext c;
  c.rank = rank;
  c.op = "rendezvous";
  if (timed_out) c.timeout = timeout;
  throw CommError(c, what + " on the store at " + address + ": " + cause, timed_out);
}

}  // namespace crosstrain::comm::store
