#include "mpi_transport/loopback/loopback_transport.h"

#include <cstring>

namespace tandem::mpi {

LoopbackHub::LoopbackHub(int size) : pools_(static_cast<std::size_t>(size)) {}

Status LoopbackTransport::create_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  std::lock_guard lock(hub_->mutex_);
  auto& p = hub_->pools_[static_cast<std::size_t>(rank_)];
  p.memory.reset(new uint8_t[block_bytes * static_cast<std::size_t>(n_blocks)]());
  p.block_bytes = block_bytes;
  p.n_blocks = n_blocks;
  *base = p.memory.get();
  return Status();
}

Status LoopbackTransport::post(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                               Transfer& transfer) {
  if (peer < 0 || peer >= size()) return Status(StatusCode::kInvalidArgument, "no peer " + std::to_string(peer));
  if (src.size() != dst.size())
    return Status(StatusCode::kInvalidArgument, "src and dst block lists differ in length");
  std::lock_guard lock(hub_->mutex_);
  auto& me = hub_->pools_[static_cast<std::size_t>(rank_)];
  auto& them = hub_->pools_[static_cast<std::size_t>(peer)];
  if (!me.memory || !them.memory) return Status(StatusCode::kUnavailable, "pool not created");
  for (const auto& r : coalesce(src, dst)) {
    if (r.src < 0 || r.src + r.count > me.n_blocks || r.dst < 0 || r.dst + r.count > them.n_blocks)
      return Status(StatusCode::kOutOfRange, "block id outside the pool");
    std::memcpy(them.memory.get() + static_cast<std::size_t>(r.dst) * them.block_bytes,
                me.memory.get() + static_cast<std::size_t>(r.src) * me.block_bytes,
                static_cast<std::size_t>(r.count) * me.block_bytes);
  }
  transfer = Transfer{peer, src.size() * me.block_bytes, true, 0};
  return Status();
}

Status LoopbackTransport::test(Transfer& transfer) {
  transfer.done = true;
  return Status();
}

}  // namespace tandem::mpi
