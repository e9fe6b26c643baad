// KvTransport: moves KV blocks from this worker's pool into a peer's pool,
// with a small notification that the peer receives only once the blocks are
// in place (after NIXL's backend interface). One interface, backends in
// sibling folders (loopback/, mpi_rma/, mpi_two_sided/, libfabric/, nccl/), all held to
// one conformance suite (tests/conformance/).
//
// Contract:
//  - The pool is set up once, collectively, before any transfer: either the
//    caller registers memory it allocated (register_pool), or the backend
//    allocates it where it can make it faster to reach (allocate_pool: MPI
//    RMA's MPI_Win_allocate gives a shared-memory window that moves 1.3-2x
//    faster on one node than a window over malloc'ed memory). Either way the
//    memory stays valid until destroy(); the runtime's BlockPool uses it.
//  - post() starts copying our blocks src[i] into the peer's blocks dst[i]
//    (same count; runs of consecutive ids on both sides move as one copy)
//    and never blocks. The src blocks must not change until poll() reports
//    the transfer done or aborted.
//  - poll() never blocks. kDone: the blocks are in the peer's pool (or will
//    be before the peer can see the notification) and the src blocks may be
//    reused. The peer receives the notification from its progress() once the
//    blocks are in place, never before.
//  - A transfer advances only in poll() and progress(), never in post().
//  - abort() gives up on a transfer: the src blocks are released as soon as
//    no more of them can be read (poll() then reports kAborted), and the peer
//    receives the notification marked aborted instead (its dst blocks may
//    hold part of the data; they are its own again). Every post therefore
//    ends, at the peer, in exactly one notification: a receiver that reserved
//    blocks for a transfer knows when it may reuse them. A transfer already
//    done stays done: abort() changes nothing then.
//  - release() forgets a transfer that poll() reported done or aborted.
//  - progress() drives incoming transfers (two-sided backends place blocks
//    here) and outgoing ones, and hands over the notifications that have
//    arrived. Every rank's main loop calls it; it never blocks.
//  - Nothing here is thread-safe: one thread (the rank's main loop) drives it.
//
// Not all MPI calls can be made to complete without waiting: where a backend
// must wait (MPI RMA's MPI_Win_flush, which returns at once when the puts are
// already complete), its header says so.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::mpi {

// What a backend can do; asked, not assumed.
struct Capabilities {
  bool device_memory = false;  // the pool may be GPU memory
  bool one_sided = false;      // the target's CPU does nothing to receive the data (it still polls for notifications)
  bool caller_memory = true;   // register_pool works (else only allocate_pool)
  std::size_t max_notification_bytes = 1 << 16;
  bool row_slices = false;     // post_slice works (KV between tensor-parallel groups of different widths)
};

// Part of each block, for KV between tensor-parallel groups of different
// widths (a rank holds some of the KV heads, so its blocks are narrower):
// every block is `rows` rows (layers x K and V in the pool's head-major
// blocks, the same on both sides), a row holding every KV head of one rank
// (each a run of block_size tokens), so a row is block_bytes / rows bytes
// on each side. The slice copies bytes
// [src_offset, src_offset + bytes) of each of our rows into [dst_offset,
// dst_offset + bytes) of the peer's row.
struct RowSlice {
  int64_t rows = 1;
  std::size_t src_offset = 0, dst_offset = 0, bytes = 0;
};

using XferId = int64_t;
enum class XferState { kPending, kDone, kAborted };

struct Notification {
  int peer = -1;     // who posted the transfer
  bool aborted = false;
  std::vector<uint8_t> bytes;
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;  // this endpoint's rank among the transport's ranks
  virtual int size() const = 0;
  virtual Capabilities capabilities() const = 0;

  // Collective, once: n_blocks blocks of block_bytes each, allocated by the
  // backend; *base receives the memory (valid until destroy()).
  [[nodiscard]] virtual Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) = 0;
  // Collective, once: the caller's memory at `base` (host memory, or device
  // memory where capabilities().device_memory) becomes reachable by peers.
  // The caller keeps it allocated until destroy().
  [[nodiscard]] virtual Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) = 0;

  // Never blocks; see the contract above. notification: at most
  // capabilities().max_notification_bytes, copied.
  [[nodiscard]] virtual Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                    std::span<const uint8_t> notification, XferId& id) = 0;
  // The same for one RowSlice of each block (capabilities().row_slices; else kUnimplemented).
  [[nodiscard]] virtual Status post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                          const RowSlice& slice, std::span<const uint8_t> notification, XferId& id) {
    (void)peer, (void)src, (void)dst, (void)slice, (void)notification, (void)id;
    return Status(StatusCode::kInvalidArgument, std::string(name()) + " does not move parts of blocks (row slices)");
  }
  // A pool seen anew: `peer`'s blocks (ours, where peer == rank()) are now
  // `block_bytes` each, `n_blocks` of them, in the memory that pool was set
  // up with (no more bytes than it had): tensor-parallel workers that change
  // width between epochs hold other KV heads, so other block sizes. Local,
  // not collective: every rank that moves KV to or from that pool calls it
  // before its next transfer there, and none may be in flight to or from it
  // then. An error where the backend cannot (NCCL).
  [[nodiscard]] virtual Status relayout(int peer, std::size_t block_bytes, int64_t n_blocks) {
    (void)peer, (void)block_bytes, (void)n_blocks;
    return Status(StatusCode::kInvalidArgument, std::string(name()) + " cannot change a pool's block size");
  }
  [[nodiscard]] virtual Status poll(XferId id, XferState& state) = 0;
  [[nodiscard]] virtual Status abort(XferId id) = 0;
  virtual void release(XferId id) = 0;
  // Appends the notifications that arrived (in no particular order: a small
  // transfer may overtake a large one posted before it).
  [[nodiscard]] virtual Status progress(std::vector<Notification>& arrived) = 0;
  // Collective, at the end: completes what is in flight, then frees the pool
  // if the backend allocated it.
  [[nodiscard]] virtual Status destroy() = 0;
};

// The poll() and abort() every backend shares over its table of outgoing
// transfers (map XferId -> a struct with `state` and `aborted`), given its
// advance(id, transfer), which moves a transfer on without blocking.
template <class Table, class Advance>
[[nodiscard]] Status poll_outgoing(Table& table, XferId id, XferState& state, Advance&& advance) {
  auto it = table.find(id);
  if (it == table.end()) return Status(StatusCode::kNotFound, "unknown transfer " + std::to_string(id));
  TANDEM_RETURN_IF_ERROR(advance(id, it->second));
  state = it->second.state;
  return Status();
}
template <class Table, class Advance>
[[nodiscard]] Status abort_outgoing(Table& table, XferId id, Advance&& advance) {
  auto it = table.find(id);
  if (it == table.end()) return Status(StatusCode::kNotFound, "unknown transfer " + std::to_string(id));
  if (it->second.state == XferState::kPending) it->second.aborted = true;  // data already sent lands; the notice says aborted
  return advance(id, it->second);
}

// Whether any transfer of a backend's table (map XferId -> struct with `state`) is still pending.
template <class Table>
bool any_pending(const Table& table) {
  for (const auto& [id, o] : table)
    if (o.state == XferState::kPending) return true;
  return false;
}

// Runs of consecutive ids in both lists, as (src start, dst start, length).
struct BlockRun {
  int32_t src, dst, count;
};
std::vector<BlockRun> coalesce(std::span<const int32_t> src, std::span<const int32_t> dst);
// The same into `runs` (cleared first), whose capacity a backend keeps from post to post.
void coalesce(std::span<const int32_t> src, std::span<const int32_t> dst, std::vector<BlockRun>& runs);

// What every backend's post() checks first: a peer among `size` ranks, block
// lists of equal length, every id inside our pool and the peer's, and a
// notification no longer than `max_notification`.
[[nodiscard]] Status check_post(int peer, int size, std::span<const int32_t> src, std::span<const int32_t> dst,
                                int64_t our_blocks, int64_t their_blocks, std::size_t notification_bytes = 0,
                                std::size_t max_notification = 1 << 16);
// Each rank's pool bytes (blocks x block bytes), as set up: what relayout() stays inside.
std::vector<uint64_t> capacities(const std::vector<int64_t>& blocks, const std::vector<uint64_t>& block_bytes);
// What relayout() checks: a peer among `size` ranks, and n_blocks blocks of
// block_bytes within the pool's `capacity` bytes.
[[nodiscard]] Status check_relayout(int peer, int size, std::size_t capacity, std::size_t block_bytes, int64_t n_blocks);
// relayout() where a backend keeps every rank's pool by rank (RMA, two-sided): checked, then `blocks` and
// `block_bytes` updated at `peer` (capacity: capacities() as set up; empty before).
[[nodiscard]] Status relayout_peer(int peer, std::size_t block_bytes, int64_t n_blocks, const std::vector<uint64_t>& capacity,
                                   std::vector<int64_t>& blocks, std::vector<uint64_t>& bytes);
// What post() checks of the two pools' block sizes (whole blocks: the same),
// and post_slice() of a slice (rows dividing both blocks, inside both rows).
[[nodiscard]] Status check_block_bytes(std::size_t ours, std::size_t theirs, const RowSlice* slice = nullptr);
// Our blocks' slice bytes, block after block (two-sided backends pack them so).
void pack_slices(const uint8_t* pool, std::size_t block_bytes, std::span<const int32_t> blocks, const RowSlice& s,
                 uint8_t* out);
void unpack_slices(uint8_t* pool, std::size_t block_bytes, std::span<const int32_t> blocks, const RowSlice& s,
                   const uint8_t* in);

}  // namespace tandem::mpi
