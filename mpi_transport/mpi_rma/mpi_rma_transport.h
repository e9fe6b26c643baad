// KvTransport over MPI one-sided RMA.
//
// The pool is one window, created once on a communicator that never changes
// (Open MPI 4.1.4 corrupts data when windows are created at once on
// communicators split from one parent), with a passive-target epoch on all
// ranks (MPI_Win_lock_all) for the job's life. allocate_pool() makes it with
// MPI_Win_allocate (a shared-memory window on one node: the fast path);
// register_pool() over the caller's memory with MPI_Win_create.
//
// post() issues one MPI_Rput per run of consecutive blocks. The transfer
// advances in progress() and poll(): once every put's request has completed
// (MPI_Testall, never blocking), MPI_Win_flush makes the data complete at the
// target (it returns at once under osc/rdma, where the completed request
// means the data is there; under osc/pt2pt, TCP-only, it waits for the
// target's acknowledgement), and only then is the notification sent, as a
// message on a private duplicate of the communicator: it cannot overtake the
// data. The target's CPU does nothing for the data to land under osc/rdma;
// with osc/pt2pt its main loop, which polls MPI between engine steps,
// provides progress.
#pragma once

#include <mpi.h>

#include <memory>
#include <unordered_map>
#include <vector>

#include "mpi_transport/kv_transport.h"
#include "mpi_transport/notices.h"

namespace tandem::mpi {

class MpiRmaTransport : public KvTransport {
 public:
  // comm: the fixed communicator of every rank that holds a pool.
  explicit MpiRmaTransport(MPI_Comm comm);
  ~MpiRmaTransport() override;
  std::string_view name() const override { return "mpi_rma"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Capabilities capabilities() const override { return {false, true, true, 1 << 16, true}; }
  Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) override;
  Status relayout(int peer, std::size_t block_bytes, int64_t n_blocks) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
              std::span<const uint8_t> notification, XferId& id) override {
    return put(peer, src, dst, nullptr, notification, id);
  }
  // One MPI_Rput per run of consecutive blocks, with strided (hvector) types
  // on both sides: the MPI library moves the rows' slices, no staging.
  Status post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice& slice,
                    std::span<const uint8_t> notification, XferId& id) override {
    return put(peer, src, dst, &slice, notification, id);
  }
  Status poll(XferId id, XferState& state) override;
  Status abort(XferId id) override;
  void release(XferId id) override { outgoing_.erase(id); }
  Status progress(std::vector<Notification>& arrived) override;
  Status destroy() override;

 private:
  struct Outgoing {
    int peer = 0;
    std::vector<MPI_Request> puts;
    std::vector<uint8_t> notification;
    bool aborted = false;
    XferState state = XferState::kPending;
  };
  Status open_window(bool allocate, void* base, std::size_t block_bytes, int64_t n_blocks);
  Status put(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice* slice,
             std::span<const uint8_t> notification, XferId& id);
  // The puts of one run of `count` blocks.
  Status put_run(int peer, const BlockRun& r, const RowSlice* slice, std::vector<MPI_Request>& puts);
  Status advance(XferId id, Outgoing& o);

  MPI_Comm comm_;
  MPI_Comm notify_comm_ = MPI_COMM_NULL;  // a private channel for the notifications
  int rank_ = 0, size_ = 1;
  MPI_Win win_ = MPI_WIN_NULL;
  uint8_t* base_ = nullptr;
  std::size_t block_bytes_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;  // every rank's pool size, to check dst ids
  std::vector<uint64_t> peer_block_bytes_;  // and block size (tensor-parallel ranks of other widths hold other heads)
  std::vector<uint64_t> peer_capacity_;     // and window bytes (relayout() stays inside them)
  XferId next_id_ = 1;
  std::unordered_map<XferId, Outgoing> outgoing_;
  std::unique_ptr<Notices> notices_;
};

}  // namespace tandem::mpi
