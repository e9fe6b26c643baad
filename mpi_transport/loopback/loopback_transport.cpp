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
  std::lock_guard lock(hub_->mutex_);
  auto& me = hub_->pools_[static_cast<std::size_t>(rank_)];
  auto& them = hub_->pools_[static_cast<std::size_t>(peer)];
  if (!me.memory || !them.memory) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(check_post(peer, size(), src, dst, me.n_blocks, them.n_blocks));
  for (const auto& r : coalesce(src, dst)) {
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
