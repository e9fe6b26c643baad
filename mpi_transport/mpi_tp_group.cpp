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

// counts as MPI's ints, and their running offsets; throws where one passes INT_MAX.
void to_mpi(std::span<const int64_t> counts, std::vector<int>& out, std::vector<int>& displs) {
  out.clear();
  displs.clear();
  int64_t at = 0;
  for (const int64_t c : counts) {
    if (c > INT_MAX || at > INT_MAX)
      throw Error("an expert-parallel exchange of " + std::to_string(at + c) + " floats is too large for MPI");
    out.push_back(static_cast<int>(c));
    displs.push_back(static_cast<int>(at));
    at += c;
  }
}

int block_count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw Error("a tensor-parallel block move of " + std::to_string(bytes) + " bytes a rank is too large for MPI");
  return static_cast<int>(bytes);
}

}  // namespace

void MpiTpGroup::all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                            std::span<const int64_t> recv_counts) {
  to_mpi(send_counts, counts_[0], displs_[0]);
  to_mpi(recv_counts, counts_[1], displs_[1]);
  if (!progress_) {
    TANDEM_MPI_OR_THROW(MPI_Alltoallv(send, counts_[0].data(), displs_[0].data(), MPI_FLOAT, recv, counts_[1].data(),
                                      displs_[1].data(), MPI_FLOAT, comm_));
    return;
  }
  MPI_Request r = MPI_REQUEST_NULL;
  TANDEM_MPI_OR_THROW(MPI_Ialltoallv(send, counts_[0].data(), displs_[0].data(), MPI_FLOAT, recv, counts_[1].data(),
                                     displs_[1].data(), MPI_FLOAT, comm_, &r));
  wait(r, true);
}

void MpiTpGroup::all_gather(const float* mine, std::span<const int64_t> counts, float* all) {
  to_mpi(counts, counts_[1], displs_[1]);
  const int n = counts_[1][static_cast<std::size_t>(rank_)];
  if (!progress_) {
    TANDEM_MPI_OR_THROW(MPI_Allgatherv(mine, n, MPI_FLOAT, all, counts_[1].data(), displs_[1].data(), MPI_FLOAT, comm_));
    return;
  }
  MPI_Request r = MPI_REQUEST_NULL;
  TANDEM_MPI_OR_THROW(
      MPI_Iallgatherv(mine, n, MPI_FLOAT, all, counts_[1].data(), displs_[1].data(), MPI_FLOAT, comm_, &r));
  wait(r, true);
}

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
