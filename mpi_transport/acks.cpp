#include "mpi_transport/acks.h"

#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

Status Acks::send(int peer, int64_t id) {
  sending_.emplace_back(MPI_REQUEST_NULL, std::make_unique<int64_t>(id));
  TANDEM_MPI(MPI_Isend(sending_.back().second.get(), 1, MPI_INT64_T, peer, tag_, comm_, &sending_.back().first));
  return Status();
}

Status Acks::poll(const std::function<void(int64_t)>& on) {
  TANDEM_RETURN_IF_ERROR(receive_waiting<int64_t>(comm_, tag_, MPI_INT64_T, [&](int, const std::vector<int64_t>& id) {
    if (id.size() == 1) on(id[0]);
    return Status();
  }));
  while (!sending_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&sending_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    sending_.pop_front();
  }
  return Status();
}

}  // namespace tandem::mpi
