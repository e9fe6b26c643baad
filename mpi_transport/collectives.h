// Collectives the job's ranks wait in without spinning: they share cores
// with ranks still working (rank 0 reading a large input through before any
// work, a group's ranks leaving their old workers one by one), so each is
// started non-blocking and tested with a backoff, never a busy MPI_Wait.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <string>

namespace tandem::mpi {

// Waits for `req` to complete, sleeping up to cap_us between tests.
void wait_idle(MPI_Request& req, int cap_us = 2000);
// The least of every rank's `value` over `comm`.
int64_t min_over(MPI_Comm comm, int64_t value);
// The error of the lowest rank of `comm` that has one ("" when none has), on
// every rank; another rank's is prefixed with its number.
std::string first_error(MPI_Comm comm, const std::string& error);

}  // namespace tandem::mpi
