// MPI back end (OpenMPI from Debian) behind the Communicator interface, for jobs started by mpirun.
// Operations are MPI's non-blocking collectives and point-to-point (MPI_Iallreduce, MPI_Isend, ...); wait()
// polls MPI_Test until the timeout. Within a host OpenMPI moves bytes through shared memory.
#pragma once

#include <memory>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// True when this build has the MPI back end.
bool mpi_available();
// True when MPI is initialized with MPI_THREAD_MULTIPLE (any thread may call it): our algorithms (comm.algo) send
// from a worker thread while the caller's thread uses MPI too.
bool mpi_thread_multiple();
// The world of an mpirun job (initializes MPI with MPI_THREAD_MULTIPLE; finalizes it when destroyed).
// Throws UsageError when the build has no MPI or the process was not started by mpirun.
std::unique_ptr<Communicator> make_mpi_world(Millis timeout);

}  // namespace crosstrain::comm
