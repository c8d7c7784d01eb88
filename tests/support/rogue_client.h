// A stranger at a job's rendezvous store: tests that refusals name the address while the job goes on.
#pragma once

#include <chrono>
#include <string>

#include "crosstrain/store/client.h"
#include "crosstrain/core/error.h"

namespace crosstrain::testing {

// The CommError a client of `job` holding `secret` gets from the store at 127.0.0.1:port, or "(admitted)". It
// claims rank 1 of `world_size`, which a member holds: it must not even get that far.
inline std::string rogue_join(int port, const std::string& job, const std::string& secret, int world_size) {
  comm::store::Hello h;
  h.rank = 1;
  h.world_size = world_size;
  h.job = job;
  try {
    comm::store::StoreClient c("127.0.0.1", port, h, std::chrono::milliseconds(5000), secret);
  } catch (const CommError& e) {
    return e.what();
  }
  return "(admitted)";
}

}  // namespace crosstrain::testing
