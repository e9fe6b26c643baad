// KvTransport over MPI one-sided RMA.
//
// create_pool() allocates every rank's pool with MPI_Win_allocate, once, on a
// communicator that never changes (Open MPI 4.1.4 corrupts data when windows
// are created at once on communicators split from one parent), and opens a
// passive-target epoch on all ranks (MPI_Win_lock_all) for the job's life.
// post() issues one MPI_Put per run of consecutive blocks; test() flushes the
// target (MPI_Win_flush), which is remote completion. The target never has to
// call MPI for a put to land when osc/rdma carries the window (shared memory,
// RDMA networks); with osc/pt2pt (TCP-only) the target's main loop, which
// polls MPI between engine steps, provides progress.
#pragma once

#include <mpi.h>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

class MpiRmaTransport : public KvTransport {
 public:
  // comm: the fixed communicator of every rank that holds a pool.
  explicit MpiRmaTransport(MPI_Comm comm);
  ~MpiRmaTransport() override;
  std::string_view name() const override { return "mpi_rma"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, Transfer& transfer) override;
  Status test(Transfer& transfer) override;
  Status destroy() override;

 private:
  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  MPI_Win win_ = MPI_WIN_NULL;
  uint8_t* base_ = nullptr;
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;  // every rank's pool size, to check dst ids
};

}  // namespace tandem::mpi
