// A tensor-parallel group over MPI (runtime/cpu/tp_group.h): the ranks of one
// worker on a communicator of their own. The row-parallel products' partial
// sums are gathered from every rank (MPI_Allgather) and added in rank order
// in the fixed tree on each of them, not reduced by MPI_Allreduce, whose
// order of addition Open MPI does not promise: that is what keeps outputs
// the same bits at every width.
#pragma once

#include <mpi.h>

#include <functional>
#include <span>
#include <vector>

#include "runtime/cpu/tp_group.h"

namespace tandem::mpi {

class MpiTpGroup : public runtime::cpu::TpGroup {
 public:
  explicit MpiTpGroup(MPI_Comm group);  // the communicator stays the caller's
  runtime::cpu::TpShard shard() const override { return {rank_, width_}; }
  // Throws tandem::Error on an MPI error.
  void reduce_tree(float* data, int64_t n) override;
  void gather(const void* mine, std::size_t bytes, void* all) override;
  void scatter(const void* all, std::size_t bytes, void* mine) override;
  // MPI_Ialltoallv and MPI_Iallgatherv, waited on as reduce_tree's exchange.
  void all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                  std::span<const int64_t> recv_counts) override;
  void all_gather(const float* mine, std::span<const int64_t> counts, float* all) override;
  // Called while an exchange waits for the other ranks (the rank's KV
  // transport: a rank inside a forward pass still receives KV and sends its
  // notices, so no rank waiting on it waits for ever). Without one the
  // exchange is a blocking MPI_Allgather.
  void set_progress(std::function<void()> progress) { progress_ = std::move(progress); }

 private:
  // Waits for r, moving the rank's KV on meanwhile (progress_).
  void wait(MPI_Request& r, bool brief);
  std::function<void()> progress_;
  MPI_Comm comm_;
  int rank_ = 0, width_ = 1;
  std::vector<float> gathered_;              // [width][n]
  std::vector<std::vector<float>> buffers_;  // the tree's partial sums
  std::vector<int> counts_[2], displs_[2];   // the variable exchanges' counts and offsets, as MPI takes them
};

}  // namespace tandem::mpi
