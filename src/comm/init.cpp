#include "crosstrain/comm/init.h"

#include <cstdio>

#include "crosstrain/comm/algorithms/communicator.h"
#include "crosstrain/comm/backends/mpi.h"
#include "crosstrain/comm/backends/shm.h"
#include "crosstrain/comm/secure/encryption.h"

namespace crosstrain::comm {

std::unique_ptr<Communicator> init_world(const LaunchEnv& env, const CommConfig& config, int cluster) {
  validate(config);
  const Millis timeout = config.timeout();
  if (config.backend == "mpi") {
    if (env.source != LaunchSource::Mpi)
      throw UsageError("the mpi back end needs a job started by mpirun (e.g. mpirun -np 2 crosstrain ...)");
    return with_algorithms(make_mpi_world(timeout), config);
  }
  if (config.backend != "gloo")
    throw UsageError("unknown communication back end '" + config.backend + "'; use gloo or mpi");
  const JobCredentials job{env.job_id, env.secret};
  std::shared_ptr<Rendezvous> rendezvous;
  if (env.rank == 0 && !env.store_hosted_by_launcher && env.source != LaunchSource::Single) {
    rendezvous = Rendezvous::host(env.master_addr, env.master_port, env.world_size, timeout, env.rank, job);
    if (job.secret.empty() && rendezvous->listens_beyond_loopback())
      std::fprintf(stderr, "%s\n", store::open_store_warning("crosstrain", rendezvous->listen_address()).c_str());
  } else if (env.source == LaunchSource::Single) {
    // Alone: host a private store on a free loopback port.
    rendezvous = Rendezvous::host("127.0.0.1", 0, 1, timeout, 0, job);
  } else {
    rendezvous = Rendezvous::connect(env.master_addr, env.master_port, env.rank, env.world_size, timeout, job);
  }
  auto world = make_gloo_communicator(std::move(rendezvous), env.rank, env.world_size, timeout, "world");
  world = with_encryption(std::move(world),
                          data_plane_security(config, env.secret, cluster >= 0 ? cluster : env.cluster));
  if (config.shared_memory) world = with_shared_memory(std::move(world));
  return with_algorithms(std::move(world), config);
}

}  // namespace crosstrain::comm
