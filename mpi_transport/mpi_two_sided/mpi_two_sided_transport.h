// KvTransport over two-sided MPI: the fallback where one-sided windows cannot
// be created (TCP-only networks under osc/rdma, for instance).
//
// post() packs the source blocks behind a header of destination ids into
// staging buffers (so the source blocks are free again at once) and sends
// them with MPI_Isend on a private duplicate of the communicator. Once the
// sends have completed, the notification follows as one more message with
// the same tag: MPI does not let it overtake the data, and the target's
// progress(), which receives in order, places every block before it hands
// the notification over. The target must call progress() for transfers to
// it to land: Tandem's worker loop does so every iteration.
//
// With a DevicePool (a GPU's KV pool), the same messages are packed from and
// unpacked into the device by the pool's copies, through page-locked host
// buffers: KV crosses the network in host memory, staged at each end. Row
// slices (post_slice, between tensor-parallel groups of different widths)
// take one strided copy per run of consecutive blocks at each end
// (DevicePool::copy_rows).
#pragma once

#include <mpi.h>

#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "mpi_transport/device_pool.h"
#include "mpi_transport/kv_transport.h"

namespace tandem::mpi {

class MpiTwoSidedTransport : public KvTransport {
 public:
  explicit MpiTwoSidedTransport(MPI_Comm comm, DevicePool device = {});
  ~MpiTwoSidedTransport() override;
  std::string_view name() const override { return "mpi_two_sided"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // Row slices of a device pool where its copies move rows (DevicePool::copy_rows).
  Capabilities capabilities() const override {
    return {static_cast<bool>(device_), false, true, 1 << 16, !device_ || static_cast<bool>(device_.copy_rows)};
  }
  Status allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) override;
  // With a DevicePool, `base` is the device's memory, reached only through the pool's copies.
  Status register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) override;
  Status relayout(int peer, std::size_t block_bytes, int64_t n_blocks) override;
  Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
              std::span<const uint8_t> notification, XferId& id) override {
    return send(peer, src, dst, nullptr, notification, id);
  }
  // The slices are packed behind a header that says where they go in the peer's rows.
  Status post_slice(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice& slice,
                    std::span<const uint8_t> notification, XferId& id) override {
    return send(peer, src, dst, &slice, notification, id);
  }
  Status poll(XferId id, XferState& state) override;
  Status abort(XferId id) override;
  void release(XferId id) override { outgoing_.erase(id); }
  Status progress(std::vector<Notification>& arrived) override;
  Status destroy() override;
  // Host buffers allocated so far (they are recycled).
  int64_t staging_allocations() const { return staging_.allocations(); }
  // Blocks per message (at least one): kMaxMessageBytes unless a test asks for less.
  void set_max_message_bytes(std::size_t bytes) { max_message_bytes_ = bytes; }

 private:
  // A message holds up to kMaxMessageBytes of blocks (MPI counts are ints; a
  // long prompt's float32 KV passes 2 GiB): [u8 0][int64 id][int32 count]
  // [int32 dst ids...][block data...]. A transfer is zero or more of them,
  // then its notice: [u8 1][int64 id][u8 aborted][notification...]. A
  // message of row slices: [u8 2][int64 id][int32 count][int64 rows][int64
  // dst offset][int64 bytes][int32 dst ids...][each block's slices...].
  static constexpr std::size_t kMaxMessageBytes = std::size_t{64} << 20;
  struct Message {
    MPI_Request request = MPI_REQUEST_NULL;
    StagingBuffers::Buffer buffer;  // given back once the send completes
    std::size_t bytes = 0;
  };
  struct Outgoing {
    int peer = 0;
    std::vector<Message> messages;
    int unsent = 0;
    std::vector<uint8_t> notification;
    bool aborted = false;
    XferState state = XferState::kPending;
  };
  Status setup(std::size_t block_bytes, int64_t n_blocks);
  Status send(int peer, std::span<const int32_t> src, std::span<const int32_t> dst, const RowSlice* slice,
              std::span<const uint8_t> notification, XferId& id);
  // Copies `count` blocks between the pool at `block` and host memory.
  void copy_blocks(int32_t block, int32_t count, uint8_t* host, bool to_pool);
  Status advance(XferId id, Outgoing& o);
  Status receive_waiting(std::vector<Notification>& arrived);
  Status place(int source, const uint8_t* m, std::size_t size);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  // A row slice of each of `blocks` between the pool and packed host memory (to_pool: in).
  void copy_slices(std::span<const int32_t> blocks, const RowSlice& s, uint8_t* host, bool to_pool);
  DevicePool device_;
  std::shared_ptr<void> pool_memory_;  // when allocated here
  uint8_t* pool_ = nullptr;
  StagingBuffers staging_;
  StagingBuffers::Buffer incoming_;  // one message at a time is received and placed
  struct Receiving {
    MPI_Request request = MPI_REQUEST_NULL;  // the message being received into incoming_, if any
    int source = 0;
    std::size_t size = 0;
  } receiving_;
  std::size_t block_bytes_ = 0, max_message_bytes_ = kMaxMessageBytes;
  int64_t n_blocks_ = 0;
  std::vector<int64_t> peer_blocks_;
  std::vector<uint64_t> peer_block_bytes_;
  std::vector<uint64_t> peer_capacity_;  // every pool's bytes as set up (relayout() stays inside them)
  XferId next_id_ = 1;
  std::unordered_map<XferId, Outgoing> outgoing_;
  std::deque<std::pair<MPI_Request, std::vector<uint8_t>>> notices_;  // notice sends in flight
};

}  // namespace tandem::mpi
