// Starting the communication layer of a process.
#pragma once

#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/core/launch_env.h"

namespace crosstrain::comm {

struct CommConfig {
  std::string backend = "gloo";  // gloo (default); "fake" only exists inside one process
  Millis timeout{30000};         // every wait, the rendezvous and group creation
  bool shared_memory = true;     // same-host float all-reduces through shared memory (comm/shm.h)
  // Collectives through our algorithms (comm/algorithm_communicator.h): builtin, ring, tree, hd, hierarchical,
  // auto; `topology` is the file whose links auto uses.
  std::string algo = "builtin";
  std::string topology;
};

// The Gloo back end (c10d's ProcessGroupGloo) for one group over a rendezvous store.
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Rendezvous> rendezvous, int rank, int size,
                                                     Millis timeout, const std::string& name = "world");

// This process's world communicator, from the launcher's environment: connects to (or, on rank 0 when no
// launcher hosts one, hosts) the rendezvous store at MASTER_ADDR:MASTER_PORT and joins the group.
std::unique_ptr<Communicator> init_world(const LaunchEnv& env, const CommConfig& config);

}  // namespace crosstrain::comm
