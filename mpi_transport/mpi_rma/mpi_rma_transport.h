// KvTransport over MPI one-sided RMA.
//
// The pool is one window, created once on a communicator that never changes
// (Open MPI 4.1.4 corrupts data when windows are created at once on
// communicators split from one parent), with a passive-target epoch on all
// ranks (MPI_Win_lock_all) for the job's life. allocate_pool() makes it with
// MPI_Win_allocate (a shared-memory window on one node: the fast path);
// register_pool() over the caller's memory with MPI_Win_create.
//
// post() issues one put per run of consecutive blocks: MPI_Put to a rank on
// this node (shared memory: the copy happens inside the call, so no request
// is worth its cost), MPI_Rput to a rank elsewhere. The transfer advances in
// progress() and poll(): once every MPI_Rput's request has completed
// (MPI_Testall, never blocking), MPI_Win_flush makes the data complete at the
// target (it returns at once under osc/rdma, where the copy or the completed
// request means the data is there; under osc/pt2pt, TCP-only, it waits for
// the target's acknowledgement), and only then is the notification sent, as
// a message on a private duplicate of the communicator: it cannot overtake
// the data. The target's CPU does nothing for the data to land under
// osc/rdma; with osc/pt2pt its main loop, which polls MPI between engine
// steps, provides progress. Once warm, a post allocates nothing (the
// transfer table and the notices reuse their buffers): at 64 KiB a transfer
// costs what the transport before notifications did (put, flush, a separate
// ready message), ~5% over a bare MPI_Put + flush + message.
#pragma once

#include <mpi.h>

#include <memory>
#include <vector>

#include "mpi_transport/kv_transport.h"
#include "mpi_transport/notices.h"
#include "mpi_transport/xfer_table.h"

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
  // The pool's window (MPI_WIN_NULL before the pool): for benches that set
  // raw MPI against the transport on the same memory.
  MPI_Win window() const { return win_; }

 private:
  struct Outgoing {
    int peer = 0;
    std::vector<MPI_Request> puts;  // MPI_Rput's, to a peer on another node
    bool flush = false;             // any put issued: MPI_Win_flush before the notification
    std::vector<uint8_t> notice;    // packed at post(): [id][aborted][notification]
    bool aborted = false;
    XferState state = XferState::kPending;
    void reset() {
      puts.clear(), notice.clear();
      flush = false;
      aborted = false, state = XferState::kPending;
    }
  };
  Status open_window(bool allocate, void* base, std::size_t block_bytes, int64_t n_blocks);
  Status put(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice* slice,
             std::span<const uint8_t> notification, XferId& id);
  // The puts of one run of blocks.
  Status put_run(Outgoing& o, const BlockRun& r, const RowSlice* slice);
  Status issue(Outgoing& o, const uint8_t* from, int count, MPI_Datatype from_type, MPI_Aint at, MPI_Datatype to_type);
  Status advance(Outgoing& o);

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
  std::vector<char> on_node_;  // by rank: shares our node
  XferTable<Outgoing> outgoing_;
  std::vector<BlockRun> runs_;  // post()'s scratch
  std::unique_ptr<Notices> notices_;
};

}  // namespace tandem::mpi
