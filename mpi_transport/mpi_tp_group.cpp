#include "mpi_transport/mpi_tp_group.h"

#include <algorithm>
#include <climits>
#include <thread>

#include "common/error.h"
#include "mpi_transport/mpi_check.h"
#include "runtime/cpu/row_parallel.h"

namespace tandem::mpi {

MpiTpGroup::MpiTpGroup(MPI_Comm group) : comm_(group), buffers_(4) {
  TANDEM_MPI_OR_THROW(MPI_Comm_rank(comm_, &rank_));
  TANDEM_MPI_OR_THROW(MPI_Comm_size(comm_, &width_));
}

void MpiTpGroup::reduce_tree(float* data, int64_t n) {
  if (width_ == 1) return;
  if (n > INT_MAX) throw Error("a tensor-parallel exchange of " + std::to_string(n) + " floats is too large for MPI");
  gathered_.resize(static_cast<std::size_t>(n * width_));
  if (!progress_) {
    TANDEM_MPI_OR_THROW(MPI_Allgather(data, static_cast<int>(n), MPI_FLOAT, gathered_.data(), static_cast<int>(n),
                                      MPI_FLOAT, comm_));
  } else {
    MPI_Request r = MPI_REQUEST_NULL;
    TANDEM_MPI_OR_THROW(MPI_Iallgather(data, static_cast<int>(n), MPI_FLOAT, gathered_.data(), static_cast<int>(n),
                                       MPI_FLOAT, comm_, &r));
    for (int done = 0;;) {  // a step's exchange: the others are a moment away, so yield rather than sleep
      TANDEM_MPI_OR_THROW(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
      if (done) break;
      progress_();
      std::this_thread::yield();
    }
  }
  std::vector<const float*> parts;
  for (int r = 0; r < width_; ++r) parts.push_back(gathered_.data() + static_cast<std::ptrdiff_t>(r) * n);
  runtime::cpu::sum_in_tree(parts, n, data, buffers_);
}

}  // namespace tandem::mpi
