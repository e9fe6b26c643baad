// KvTransport over libfabric (OFI): how KV reaches EFA and other HPC fabrics
// without MPI's one-sided layer (after NIXL's libfabric backend and
// Mooncake's EFA transport).
//
// Set-up (collective over the MPI communicator, once): the provider is
// opened (transport.libfabric_provider: "tcp;ofi_rxm", "shm", "efa", ...; or
// the first that offers RDM endpoints with RMA and messages), the pool is
// registered once (fi_mr_reg, remote write), and every rank's endpoint
// address, pool address and key are exchanged over MPI. After that MPI
// carries nothing of the transport's: blocks and notifications go over the
// fabric.
//
// post() coalesces runs of consecutive blocks into fi_write calls (split at
// kMaxWriteBytes) issued with FI_DELIVERY_COMPLETE, so a write's completion
// here means its data is in the peer's pool. Once every write of a transfer
// has completed, its notification follows as one fi_send: the peer's
// progress() receives it only after the blocks are in place, as the
// contract asks, whatever order the provider keeps. Nothing blocks: a write
// or send the provider cannot take now (-FI_EAGAIN) waits in a queue and is
// retried by poll() and progress(), which also read the completion queue
// (providers such as tcp make progress only when it is read: the target must
// call progress(), as every worker's loop does).
//
// Row slices (KV between tensor-parallel groups of different widths) are one
// write per row of each block: in the pool's head-major blocks a row is a
// layer's K or V of every head, so a rank's heads of it are one piece
// (layers x 2 writes a block).
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mpi_transport/kv_transport.h"

struct fid_fabric;
struct fid_domain;
struct fid_ep;
struct fid_av;
struct fid_cq;
struct fid_mr;
struct fi_info;

namespace tandem::mpi {

class LibfabricTransport : public KvTransport {
 public:
  // provider: a libfabric provider name ("tcp;ofi_rxm", "shm", "efa"), or
  // "" for the first one offering what the transport needs. Nothing is
  // opened until the pool is set up.
  LibfabricTransport(MPI_Comm comm, std::string provider);
  ~LibfabricTransport() override;
  std::string_view name() const override { return "libfabric"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Capabilities capabilities() const override { return {false, true, true, kMaxNotification, true}; }
  Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) override;
  Status relayout(int peer, std::size_t block_bytes, int64_t n_blocks) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
              std::span<const uint8_t> notification, XferId& id) override;
  Status post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice& slice,
                    std::span<const uint8_t> notification, XferId& id) override;
  Status poll(XferId id, XferState& state) override;
  Status abort(XferId id) override;
  void release(XferId id) override { outgoing_.erase(id); }
  Status progress(std::vector<Notification>& arrived) override;
  Status destroy() override;
  // The provider in use ("" before the pool is set up).
  const std::string& provider() const { return provider_in_use_; }

  // Every provider here offering RDM endpoints with RMA and messages, comma-separated (for messages).
  static std::string providers_found();

 private:
  static constexpr std::size_t kMaxNotification = 1 << 16;
  static constexpr std::size_t kMaxWriteBytes = std::size_t{64} << 20;
  static constexpr int kSlots = 32;  // notification buffers posted for receiving, and kept for sending
  // A notification on the wire: [int32 sender rank][int64 id][u8 aborted][bytes].
  static constexpr std::size_t kHeader = 4 + 8 + 1;
  static constexpr std::size_t kSlotBytes = kHeader + kMaxNotification;

  // What a completion refers to (its op_context): fi_context2 first, as providers with FI_CONTEXT2 want.
  struct Op;
  struct Write {
    std::size_t src_offset = 0, dst_offset = 0, bytes = 0;
  };
  struct Outgoing {
    int peer = 0;
    std::deque<Write> unposted;  // writes the provider has not taken yet
    int in_flight = 0;           // writes posted, not completed
    std::vector<uint8_t> notification;
    bool aborted = false;
    bool notice_queued = false;
    XferState state = XferState::kPending;
  };

  Status open(std::size_t block_bytes, int64_t n_blocks);
  // post() and post_slice(): the transfer's writes, queued (slice: null for whole blocks).
  Status queue_transfer(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice* slice,
                        std::span<const uint8_t> notification, XferId& id);
  Status advance(XferId id, Outgoing& o);
  Status post_writes(XferId id, Outgoing& o);
  // Queues the notice of transfer `id` (sent as soon as a send buffer is free).
  void queue_notice(XferId id, const Outgoing& o);
  Status send_notices();
  // Reads every completion there is; notifications received go to `arrived` (null: kept for later).
  Status drain_completions(std::vector<Notification>* arrived);
  Status post_receive(int slot);
  Op* take_op();  // a completion context, reused once its completion is read
  void close_fabric();

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string provider_wanted_, provider_in_use_;
  fi_info* info_ = nullptr;
  fid_fabric* fabric_ = nullptr;
  fid_domain* domain_ = nullptr;
  fid_ep* ep_ = nullptr;
  fid_av* av_ = nullptr;
  fid_cq* cq_ = nullptr;
  fid_mr* pool_mr_ = nullptr;
  fid_mr* slots_mr_ = nullptr;
  bool virt_addr_ = false, local_mr_ = false;
  std::shared_ptr<void> pool_memory_;  // when allocated here
  uint8_t* pool_ = nullptr;
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  struct Peer {
    uint64_t fi_addr = 0;
    uint64_t base = 0, key = 0;  // where its pool is, as its provider addresses it
    int64_t blocks = 0;
    uint64_t block_bytes = 0;
    uint64_t capacity = 0;  // its pool's bytes as registered (relayout() stays inside them)
  };
  std::vector<Peer> peers_;
  // Notification buffers: kSlots for receiving, then kSlots for sending, in one registered slab.
  std::unique_ptr<uint8_t[]> slots_;
  std::vector<int> free_send_;
  std::deque<std::pair<int, std::vector<uint8_t>>> notices_waiting_;  // (peer, wire bytes) without a free buffer yet
  std::vector<std::unique_ptr<Op>> ops_;  // completion contexts, reused
  std::vector<Op*> free_ops_;
  std::vector<Notification> early_;  // notifications read while polling a transfer, handed over by progress()
  XferId next_id_ = 1;
  std::unordered_map<XferId, Outgoing> outgoing_;
  int sends_in_flight_ = 0;
};

}  // namespace tandem::mpi
