#include "mpi_transport/acks.h"

#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

Status Acks::send(int peer, int64_t id) {
  sending_.emplace_back(MPI_REQUEST_NULL, std::make_unique<int64_t>(id));
  TANDEM_MPI(MPI_Isend(sending_.back().second.get(), 1, MPI_INT64_T, peer, tag_, comm_, &sending_.back().first));
  return Status();
}

Status Acks::poll(const std::function<void(int64_t)>& on) {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    TANDEM_MPI(MPI_Iprobe(MPI_ANY_SOURCE, tag_, comm_, &flag, &st));
    if (!flag) break;
    int64_t id = 0;
    TANDEM_MPI(MPI_Recv(&id, 1, MPI_INT64_T, st.MPI_SOURCE, tag_, comm_, MPI_STATUS_IGNORE));
    on(id);
  }
  while (!sending_.empty()) {
    int done = 0;
    TANDEM_MPI(MPI_Test(&sending_.front().first, &done, MPI_STATUS_IGNORE));
    if (!done) break;
    sending_.pop_front();
  }
  return Status();
}

}  // namespace tandem::mpi
