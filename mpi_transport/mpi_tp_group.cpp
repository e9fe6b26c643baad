#include "mpi_transport/mpi_tp_group.h"

#include <algorithm>
#include <climits>
#include <thread>

#include "common/backoff.h"
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
    wait(r, true);
  }
  std::vector<const float*> parts;
  for (int r = 0; r < width_; ++r) parts.push_back(gathered_.data() + static_cast<std::ptrdiff_t>(r) * n);
  runtime::cpu::sum_in_tree(parts, n, data, buffers_);
}

void MpiTpGroup::wait(MPI_Request& r, bool brief) {
  Backoff idle;
  for (int done = 0;;) {
    TANDEM_MPI_OR_THROW(MPI_Test(&r, &done, MPI_STATUS_IGNORE));
    if (done) return;
    if (progress_) progress_();
    // A step's exchange: the others are a moment away, so yield rather than
    // sleep. A block move: a follower may first finish a wait of its own.
    if (brief) std::this_thread::yield();
    else idle.idle();
  }
}

namespace {

int block_count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw Error("a tensor-parallel block move of " + std::to_string(bytes) + " bytes a rank is too large for MPI");
  return static_cast<int>(bytes);
}

}  // namespace

void MpiTpGroup::gather(const void* mine, std::size_t bytes, void* all) {
  MPI_Request r = MPI_REQUEST_NULL;
  const int n = block_count(bytes);
  TANDEM_MPI_OR_THROW(MPI_Igather(mine, n, MPI_BYTE, rank_ == 0 ? all : nullptr, n, MPI_BYTE, 0, comm_, &r));
  wait(r, false);
}

void MpiTpGroup::scatter(const void* all, std::size_t bytes, void* mine) {
  MPI_Request r = MPI_REQUEST_NULL;
  const int n = block_count(bytes);
  TANDEM_MPI_OR_THROW(MPI_Iscatter(rank_ == 0 ? all : nullptr, n, MPI_BYTE, mine, n, MPI_BYTE, 0, comm_, &r));
  wait(r, false);
}

}  // namespace tandem::mpi
