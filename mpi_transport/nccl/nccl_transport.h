// KvTransport over NCCL: KV blocks move GPU to GPU with ncclSend/ncclRecv
// (NVLink, InfiniBand, or EFA through NCCL's network plugins).
//
// The pool is device memory: allocate_pool() cudaMallocs it on the current
// device, register_pool() takes the caller's; either way the NCCL
// communicators are built then over the transport's MPI ranks (rank 0's
// ncclUniqueId broadcast with MPI) and every pair is connected at once (a
// lazy first connection blocks the host until the peer joins). post() sends
// the peer a header over MPI (transfer id, destination runs), then issues one
// ncclSend per run of consecutive blocks in one NCCL group (two communicators
// and streams, one per direction between ranks, so opposite transfers never
// wait on each other), and records an event. The peer's progress() takes the
// header and issues the matching ncclRecv calls, in the same order (MPI keeps
// a pair's messages in order; NCCL matches a pair's point-to-point calls in
// issue order), and records an event of its own. Once the sender's event has
// completed, its notification follows the header over MPI; the peer hands it
// over only once its receive event has completed too: the blocks are in its
// pool. The source blocks must be complete on the device before post() (the
// engine waits for its step's stream). Built with TANDEM_NCCL only.
#pragma once

#include <cuda_runtime_api.h>
#include <mpi.h>
#include <nccl.h>

#include <deque>
#include <list>
#include <optional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

class NcclTransport : public KvTransport {
 public:
  explicit NcclTransport(MPI_Comm comm);
  ~NcclTransport() override;
  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Capabilities capabilities() const override { return {true, false, true, 1 << 16}; }
  Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
              std::span<const uint8_t> notification, XferId& id) override;
  Status poll(XferId id, XferState& state) override;
  Status abort(XferId id) override;
  void release(XferId id) override;
  Status progress(std::vector<Notification>& arrived) override;
  Status destroy() override;

 private:
  // Messages on the private communicator, one tag, in order: a header
  // [u8 0][int64 id][int64 runs][(int64 dst, int64 count)...], later the
  // notice [u8 1][int64 id][u8 aborted][notification...].
  struct Outgoing {
    int peer = 0;
    std::deque<std::pair<MPI_Request, std::vector<uint8_t>>> sends;  // header, then notice
    cudaEvent_t sent = nullptr;  // the NCCL sends have completed
    std::vector<uint8_t> notification;
    bool aborted = false;
    XferState state = XferState::kPending;
  };
  struct Incoming {
    int peer = 0;
    int64_t id = 0;
    cudaEvent_t done = nullptr;  // null once it has completed
    std::optional<Notification> notice;
  };
  Status setup(std::size_t block_bytes, int64_t n_blocks);
  Status advance(XferId id, Outgoing& o);
  Status send(Outgoing& o, std::vector<uint8_t> bytes);
  Status receive(std::vector<Notification>& arrived);
  int direction(int peer, bool send) const;
  Status issue(int peer, const std::vector<BlockRun>& runs, bool send);
  Status connect_all();
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  ncclComm_t nccl_[2] = {nullptr, nullptr};      // [0]: lower rank -> higher, [1]: higher -> lower
  cudaStream_t stream_[2] = {nullptr, nullptr};
  uint8_t* pool_ = nullptr;  // device memory
  bool owns_pool_ = false;
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;
  XferId next_id_ = 1;
  std::unordered_map<XferId, Outgoing> outgoing_;
  std::list<Incoming> incoming_;  // receives in flight or noticed, in arrival order
  std::deque<std::pair<MPI_Request, std::vector<uint8_t>>> retired_;  // sends of released transfers, still in flight
};

}  // namespace tandem::mpi
