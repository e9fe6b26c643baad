#include "mpi_transport/comm.h"

#include <exception>

#include "common/error.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

void throw_mpi(int rc, const char* call, const char* file, int line) {
  throw Error(mpi_status(rc, call, file, line).to_string());
}

void Comm::reset() {
  if (c_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && std::uncaught_exceptions() == 0) MPI_Comm_free(&c_);
  c_ = MPI_COMM_NULL;
}

Comm split(MPI_Comm parent, int color, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  TANDEM_MPI_OR_THROW(MPI_Comm_split(parent, color, key, &c));
  if (c != MPI_COMM_NULL) TANDEM_MPI_OR_THROW(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return Comm(c);
}

Comm split_node(MPI_Comm parent, int key) {
  MPI_Comm c = MPI_COMM_NULL;
  TANDEM_MPI_OR_THROW(MPI_Comm_split_type(parent, MPI_COMM_TYPE_SHARED, key, MPI_INFO_NULL, &c));
  TANDEM_MPI_OR_THROW(MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN));
  return Comm(c);
}

}  // namespace tandem::mpi
