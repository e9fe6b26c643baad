// A worker rank's main loop under MPI (the only thread of the rank that calls MPI).
#pragma once

#include "runtime/service/worker_core.h"
#include "mpi_transport/kv_transport.h"
#include "mpi_transport/mpi_env.h"

namespace tandem::launcher {

// The workers' communicators: `workers` never changes (KV windows live on
// it); `role` (prefill ranks vs the rest) is split again at every re-split.
struct WorkerComms {
  MPI_Comm workers = MPI_COMM_NULL;
  MPI_Comm role = MPI_COMM_NULL;
  int world_rank = 0;
};

// Runs what rank 0 (and, disaggregated, the other workers) send until rank 0
// says stop; see worker_loop.cpp for the roles it serves. transport: null when
// aggregated for the whole job. Throws tandem::Error on an MPI or transport failure.
void worker_loop(mpi::Mailbox& box, service::WorkerCore& core, mpi::KvTransport* transport, WorkerComms& comms);

}  // namespace tandem::launcher
