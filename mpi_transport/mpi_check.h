// The one checking wrapper for MPI calls: on failure it yields a Status that
// names the call, file:line and MPI's own error string. Handles are set to
// MPI_ERRORS_RETURN at start-up so that errors come back here instead of
// aborting the job.
#pragma once

#include <mpi.h>

#include <string>

#include "common/status.h"

namespace tandem::mpi {

inline Status mpi_status(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) return Status();
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  return Status(StatusCode::kInternal, std::string(call) + " failed: " + std::string(msg, static_cast<std::size_t>(len)))
      .at(file, line);
}

// For wiring code that cannot go on after a failed call: throws tandem::Error
// (one line: the call, file:line, MPI's error string).
void throw_mpi(int rc, const char* call, const char* file, int line);

}  // namespace tandem::mpi

// TANDEM_MPI_OR_THROW(MPI_Comm_split(...)): the same check, throwing.
#define TANDEM_MPI_OR_THROW(call)                                                          \
  do {                                                                                     \
    const int tandem_mpi_rc_ = (call);                                                     \
    if (tandem_mpi_rc_ != MPI_SUCCESS) ::tandem::mpi::throw_mpi(tandem_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)

// TANDEM_MPI(MPI_Send(...)) returns the failure Status from the enclosing function.
#define TANDEM_MPI(call)                                                           \
  do {                                                                             \
    const int tandem_mpi_rc_ = (call);                                             \
    if (tandem_mpi_rc_ != MPI_SUCCESS)                                             \
      return ::tandem::mpi::mpi_status(tandem_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
