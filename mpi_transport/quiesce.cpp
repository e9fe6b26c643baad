#include "mpi_transport/quiesce.h"

#include <algorithm>
#include <vector>

#include "common/backoff.h"
#include "common/error.h"
#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

void quiesce(MPI_Comm world, KvTransport* transport) {
  MPI_Request all_here = MPI_REQUEST_NULL;
  TANDEM_MPI_OR_THROW(MPI_Ibarrier(world, &all_here));
  Backoff idle;
  std::vector<Notification> late;
  std::vector<char> stray;
  for (int done = 0;;) {
    TANDEM_MPI_OR_THROW(MPI_Test(&all_here, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (transport) {
      late.clear();
      if (Status st = transport->progress(late); !st.ok()) throw Error(st.to_string());
    }
    int waiting = 0, bytes = 0;
    MPI_Status st;
    TANDEM_MPI_OR_THROW(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, world, &waiting, &st));
    if (waiting) {
      TANDEM_MPI_OR_THROW(MPI_Get_count(&st, MPI_BYTE, &bytes));
      stray.resize(static_cast<std::size_t>(std::max(bytes, 1)));
      TANDEM_MPI_OR_THROW(MPI_Recv(stray.data(), bytes, MPI_BYTE, st.MPI_SOURCE, st.MPI_TAG, world, MPI_STATUS_IGNORE));
      continue;
    }
    idle.idle();
  }
}

}  // namespace tandem::mpi
