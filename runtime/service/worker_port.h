// How a worker service reaches the rest of the job: the protocol's messages
// to and from rank 0 and the other workers, KV transfers into a peer's pool
// with their notifications. The
// MPI implementation is mpi_transport/mpi_worker_port.h; the unit tests use
// an in-process one, so the service runs and is tested without mpirun.
//
// Nothing here blocks. Every call throws tandem::Error (one line, naming the
// failing call) when the link fails: the job cannot go on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/service/protocol.h"

namespace tandem::service {

class WorkerPort {
 public:
  struct Message {
    int source = 0;  // world rank
    MsgType type = MsgType::kRequest;
    std::vector<uint8_t> bytes;
  };
  enum class KvState { kPending, kDone, kAborted };
  struct KvArrival {
    int source = 0;        // world rank of the sender
    bool aborted = false;  // the sender gave up: the blocks reserved for it are free again
    std::vector<uint8_t> note;
  };

  virtual ~WorkerPort() = default;
  virtual int rank() const = 0;  // this worker's world rank

  // The next message for this worker, if one is waiting.
  virtual bool receive(Message& out) = 0;
  virtual void send(int dest, MsgType type, std::vector<uint8_t> bytes) = 0;

  // KV transfers between workers' pools (false: aggregated for the whole job, none).
  virtual bool has_kv() const = 0;
  // Part of each block, for KV between tensor-parallel groups of different
  // widths: each block is `rows` rows (layers x K and V x tokens), a row
  // one token's KV heads as each side holds them; bytes [src_offset,
  // src_offset + bytes) of each of our rows go to [dst_offset, ...) of the
  // peer's (mpi_transport's RowSlice).
  struct KvSlice {
    int64_t rows = 1;
    std::size_t src_offset = 0, dst_offset = 0, bytes = 0;
  };
  // Our blocks src (or a slice of each: null for whole blocks) into `dest`'s
  // (a world rank) blocks dst; `note` reaches it once they are there.
  // Returns the transfer's id.
  virtual int64_t post_kv(int dest, std::span<const int32_t> src, std::span<const int32_t> dst,
                          std::span<const uint8_t> note, const KvSlice* slice = nullptr) = 0;
  // What a post of n_blocks of ours (block_bytes each) to `dest` puts on the
  // wire, over every rank of this worker (a tensor-parallel group's ranks send their shards).
  virtual int64_t kv_wire_bytes(int dest, int64_t n_blocks, std::size_t block_bytes) const {
    (void)dest;
    return n_blocks * static_cast<int64_t>(block_bytes);
  }
  virtual KvState poll_kv(int64_t id) = 0;
  virtual void release_kv(int64_t id) = 0;
  // Appends the notes of transfers to us that have landed.
  virtual void kv_arrivals(std::vector<KvArrival>& out) = 0;

  // `peer`'s pool (a world rank's; ours where peer == rank()) is now n_blocks
  // of block_bytes: its worker regrouped at another width. Local; no
  // transfer to or from that pool may be in flight.
  virtual void relayout_kv(int peer, std::size_t block_bytes, int64_t n_blocks) {
    (void)peer, (void)block_bytes, (void)n_blocks;
  }
  // The workers as they stand after a regroup (kGroupMap; `bytes` as it came):
  // a tensor-parallel leader's port routes by it and tells its followers.
  virtual void set_group_map(const WireGroupMap& map, const std::vector<uint8_t>& bytes) { (void)map, (void)bytes; }

  // Waits until every message sent has left (the end of the job).
  virtual void flush() = 0;
};

}  // namespace tandem::service
