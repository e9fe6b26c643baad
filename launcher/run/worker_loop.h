// A worker rank's main loop under MPI (the only thread of the rank that calls MPI).
#pragma once

#include "launcher/run/worker_core.h"
#include "mpi_transport/kv_transport.h"
#include "mpi_transport/mpi_env.h"

namespace tandem::launcher {

// Runs what rank 0 (and, disaggregated, the other workers) send until rank 0
// says stop; see worker_loop.cpp for the roles it serves. transport: null when
// aggregated. Throws tandem::Error on an MPI or transport failure.
void worker_loop(mpi::Mailbox& box, WorkerCore& core, mpi::KvTransport* transport);

}  // namespace tandem::launcher
