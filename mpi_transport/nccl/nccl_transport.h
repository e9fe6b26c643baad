// KvTransport over NCCL: KV blocks move GPU to GPU with ncclSend/ncclRecv
// (NVLink, InfiniBand, or EFA through NCCL's network plugins).
//
// create_pool() allocates the pool in device memory (cudaMalloc, the current
// device) and builds the NCCL communicator over the transport's MPI ranks,
// rank 0's ncclUniqueId broadcast with MPI, then connects every pair at once
// (a lazy first connection blocks the host until the peer joins). post() sends the peer a header
// over MPI (transfer id, destination runs), then issues one ncclSend per run
// of consecutive blocks in one NCCL group (two communicators and streams, one
// per direction between ranks, so opposite transfers never wait on each other). The
// peer's progress() takes the header and issues the matching ncclRecv calls,
// in the same order (MPI keeps a pair's headers in order; NCCL matches a
// pair's point-to-point calls in issue order), records an event, and
// acknowledges over MPI once the event has completed: test() on the sender
// reports done on that acknowledgement (remote completion, as every backend).
// The source blocks must be complete on the device before post() (the engine
// waits for its step's stream). Built with TANDEM_NCCL only.
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mpi_transport/acks.h"
#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

class NcclTransport : public KvTransport {
 public:
  explicit NcclTransport(MPI_Comm comm);
  ~NcclTransport() override;
  std::string_view name() const override { return "nccl"; }
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
    std::vector<int64_t> header;  // [id][runs][dst start, count]...
    bool acked = false;
  };
  struct Incoming {
    int peer = 0;
    int64_t id = 0;
    cudaEvent_t done = nullptr;
  };
  int direction(int peer, bool send) const;
  Status issue(int peer, const std::vector<BlockRun>& runs, bool send);
  Status connect_all();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t nccl_[2] = {nullptr, nullptr};      // [0]: lower rank -> higher, [1]: higher -> lower
  cudaStream_t stream_[2] = {nullptr, nullptr};
  uint8_t* pool_ = nullptr;  // device memory
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;
  int64_t next_id_ = 1;
  std::unordered_map<int64_t, Outgoing> outgoing_;
  std::deque<Incoming> incoming_;  // receives in flight, in issue order
  std::unique_ptr<Acks> acks_;
};

}  // namespace tandem::mpi
