#include "mpi_transport/collectives.h"

#include <climits>

#include "common/backoff.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

void wait_idle(MPI_Request& req, int cap_us) {
  Backoff idle;
  for (int done = 0;;) {
    TANDEM_MPI_OR_THROW(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    idle.idle(cap_us);
  }
}

int64_t min_over(MPI_Comm comm, int64_t value) {
  MPI_Request req = MPI_REQUEST_NULL;
  TANDEM_MPI_OR_THROW(MPI_Iallreduce(MPI_IN_PLACE, &value, 1, MPI_INT64_T, MPI_MIN, comm, &req));
  wait_idle(req);
  return value;
}

std::string first_error(MPI_Comm comm, const std::string& error) {
  int rank = 0;
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(comm, &rank));
  int mine = error.empty() ? INT_MAX : rank, first = INT_MAX;
  MPI_Request req = MPI_REQUEST_NULL;
  TANDEM_MPI_OR_THROW(MPI_Iallreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm, &req));
  wait_idle(req, 20000);
  if (first == INT_MAX) return "";
  int len = rank == first ? static_cast<int>(error.size()) : 0;
  TANDEM_MPI_OR_THROW(MPI_Bcast(&len, 1, MPI_INT, first, comm));
  std::string verdict = rank == first ? error : std::string(static_cast<std::size_t>(len), '\0');
  TANDEM_MPI_OR_THROW(MPI_Bcast(verdict.data(), len, MPI_CHAR, first, comm));
  return first == 0 ? verdict : "rank " + std::to_string(first) + ": " + verdict;
}

}  // namespace tandem::mpi
