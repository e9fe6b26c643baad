// KvTransport: moves KV blocks from this worker's pool into a peer's pool.
// One interface, several backends in sibling folders (loopback/, mpi_rma/,
// later nccl/ and libfabric/), all held to one conformance suite
// (tests/conformance/).
//
// Contract:
//  - create_pool() is collective over the transport's ranks and called once at
//    start-up: it allocates this rank's pool and makes it reachable by peers.
//  - post() starts copying our blocks src[i] into the peer's blocks dst[i]
//    (same count; runs of consecutive ids on both sides move as one copy). It
//    does not block. The src blocks must not change until test() reports done.
//  - test() reports done once the data is in the peer's pool (remote
//    completion); after that a notification sent to the peer may promise it.
//  - Nothing here is thread-safe: one thread (the rank's main loop) drives it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace tandem::mpi {

struct Transfer {
  int peer = -1;
  std::size_t bytes = 0;
  bool done = false;
  int64_t backend_handle = 0;  // backend-private
};

class KvTransport {
 public:
  virtual ~KvTransport() = default;
  virtual std::string_view name() const = 0;
  virtual int rank() const = 0;  // this endpoint's rank among the transport's ranks
  virtual int size() const = 0;

  // Collective, once: n_blocks blocks of block_bytes each; *base receives our pool's memory.
  [[nodiscard]] virtual Status create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) = 0;
  [[nodiscard]] virtual Status post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                                    Transfer& transfer) = 0;
  [[nodiscard]] virtual Status test(Transfer& transfer) = 0;
  // Drives incoming transfers (two-sided backends place received blocks here);
  // every rank's main loop calls it. Never blocks.
  [[nodiscard]] virtual Status progress() { return Status(); }
  // Collective, at the end.
  [[nodiscard]] virtual Status destroy() = 0;
};

// Runs of consecutive ids in both lists, as (src start, dst start, length).
struct BlockRun {
  int32_t src, dst, count;
};
std::vector<BlockRun> coalesce(std::span<const int32_t> src, std::span<const int32_t> dst);

// What every backend's post() checks first: a peer among `size` ranks, block
// lists of equal length, and every id inside our pool and the peer's.
[[nodiscard]] Status check_post(int peer, int size, std::span<const int32_t> src, std::span<const int32_t> dst,
                                int64_t our_blocks, int64_t their_blocks);

}  // namespace tandem::mpi
