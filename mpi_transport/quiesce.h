// The end of a job on every rank: all ranks meet before the KV transport
// closes, and meanwhile KV still moves and late messages are taken (and
// dropped), so a rank that left with a transfer or a large message in flight
// (an abandoned job) cannot keep another waiting for it. Collective over
// `world`; never spins (it backs off while nothing arrives).
#pragma once

#include <mpi.h>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

// `transport`: this rank's KV transport, or null. Throws tandem::Error when MPI or the transport fails.
void quiesce(MPI_Comm world, KvTransport* transport);

}  // namespace tandem::mpi
