#include "mpi_transport/mpi_rma/mpi_rma_transport.h"

#include "mpi_transport/mpi_check.h"

namespace tandem::mpi {

MpiRmaTransport::MpiRmaTransport(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiRmaTransport::~MpiRmaTransport() {
  if (win_ != MPI_WIN_NULL) (void)destroy();
}

Status MpiRmaTransport::create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  block_bytes_ = block_bytes;
  n_blocks_ = n_blocks;
  const auto bytes = static_cast<MPI_Aint>(block_bytes * static_cast<std::size_t>(n_blocks));
  TANDEM_MPI(MPI_Win_allocate(bytes, 1, MPI_INFO_NULL, comm_, &base_, &win_));
  TANDEM_MPI(MPI_Win_set_errhandler(win_, MPI_ERRORS_RETURN));
  peer_blocks_.resize(static_cast<std::size_t>(size_));
  TANDEM_MPI(MPI_Allgather(&n_blocks_, 1, MPI_INT64_T, peer_blocks_.data(), 1, MPI_INT64_T, comm_));
  TANDEM_MPI(MPI_Win_lock_all(MPI_MODE_NOCHECK, win_));
  *base = base_;
  return Status();
}

Status MpiRmaTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                             Transfer& transfer) {
  if (win_ == MPI_WIN_NULL) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(
      check_post(peer, size_, src, dst, n_blocks_, peer >= 0 && peer < size_ ? peer_blocks_[static_cast<std::size_t>(peer)] : 0));
  for (const auto& r : coalesce(src, dst)) {
    // MPI counts are ints: split very long runs.
    const std::size_t total = static_cast<std::size_t>(r.count) * block_bytes_;
    const std::size_t chunk = std::size_t{1} << 30;
    for (std::size_t off = 0; off < total; off += chunk) {
      const int n = static_cast<int>(std::min(chunk, total - off));
      TANDEM_MPI(MPI_Put(base_ + static_cast<std::size_t>(r.src) * block_bytes_ + off, n, MPI_BYTE, peer,
                         static_cast<MPI_Aint>(static_cast<std::size_t>(r.dst) * block_bytes_ + off), n, MPI_BYTE,
                         win_));
    }
  }
  transfer = Transfer{peer, src.size() * block_bytes_, src.empty(), 0};
  return Status();
}

Status MpiRmaTransport::test(Transfer& transfer) {
  if (transfer.done) return Status();
  TANDEM_MPI(MPI_Win_flush(transfer.peer, win_));
  transfer.done = true;
  return Status();
}

Status MpiRmaTransport::destroy() {
  if (win_ == MPI_WIN_NULL) return Status();
  TANDEM_MPI(MPI_Win_unlock_all(win_));
  TANDEM_MPI(MPI_Win_free(&win_));
  win_ = MPI_WIN_NULL;
  return Status();
}

}  // namespace tandem::mpi
