// Starting the communication layer of a process.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/config.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/core/launch_env.h"

namespace crosstrain::comm {

// The Gloo back end (c10d's ProcessGroupGloo) for one group over a rendezvous store. `abandoned`, when given, ends
// the group's formation early (a CommError) once it says true: an elastic generation that a failure ended before
// all its members arrived.
std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Rendezvous> rendezvous, int rank, int size,
                                                     Millis timeout, const std::string& name = "world",
                                                     std::function<bool()> abandoned = {});

// This process's world communicator, from the launcher's environment: connects to (or, on rank 0 when no
// launcher hosts one, hosts) the rendezvous store at MASTER_ADDR:MASTER_PORT and joins the group, then wraps it
// as `config` says (sealed messages, shared memory, our algorithms). `cluster` is this process's cluster for
// comm.encrypt = "wan" (-1: unknown; hosts then count as clusters). config.compression is not used here (the
// gradient reducer's).
std::unique_ptr<Communicator> init_world(const LaunchEnv& env, const CommConfig& config, int cluster = -1);

}  // namespace crosstrain::comm
