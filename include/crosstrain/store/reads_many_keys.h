// Stores that read several keys in one request. A group forms by reading every member's address from the store:
// one round trip per member across a wide-area link made a six-rank group take 1.5 s to form; read together, the
// addresses cost one (comm/backends/group_formation_store.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace crosstrain::comm::store {

class ReadsManyKeys {
 public:
  virtual ~ReadsManyKeys() = default;
  // Waits up to `wait` for every key, then returns their values in the order of `keys`. Throws CommError, with
  // timed_out() set, when some key is still missing then.
  virtual std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys,
                                                     std::chrono::milliseconds wait) = 0;
};

}  // namespace crosstrain::comm::store
