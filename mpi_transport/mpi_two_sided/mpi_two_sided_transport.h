// KvTransport over two-sided MPI: the fallback where one-sided windows cannot
// be created (TCP-only networks under osc/rdma, for instance).
//
// post() packs the source blocks behind a header of destination ids and sends
// them with MPI_Isend on a private duplicate of the communicator; the target's
// progress() receives, copies each block into place and acknowledges; the
// sender's test() reports done when the acknowledgement arrives (remote
// completion, as for RMA). The target must call progress() for transfers to
// it to finish: Tandem's worker loop does so every iteration.
#pragma once

#include <mpi.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mpi_transport/acks.h"
#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

class MpiTwoSidedTransport : public KvTransport {
 public:
  explicit MpiTwoSidedTransport(MPI_Comm comm);
  ~MpiTwoSidedTransport() override;
  std::string_view name() const override { return "mpi_two_sided"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, Transfer& transfer) override;
  Status test(Transfer& transfer) override;
  Status progress() override;
  Status destroy() override;

 private:
  struct Outgoing {
    MPI_Request request = MPI_REQUEST_NULL;
    std::vector<uint8_t> bytes;  // [int64 id][int32 count][int32 dst ids...][block data...]
    bool sent = false, acked = false;
  };
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::unique_ptr<uint8_t[]> pool_;
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;
  int64_t next_id_ = 1;
  std::unordered_map<int64_t, Outgoing> outgoing_;
  std::unique_ptr<Acks> acks_;
};

}  // namespace tandem::mpi
