#include "mpi_transport/loopback/loopback_transport.h"

#include <cstring>

namespace tandem::mpi {

LoopbackHub::LoopbackHub(int size) : pools_(static_cast<std::size_t>(size)) {}

Status LoopbackTransport::allocate_pool(std::size_t block_bytes, int64_t n_blocks, void** base) {
  std::lock_guard lock(hub_->mutex_);
  auto& p = hub_->pools_[static_cast<std::size_t>(rank_)];
  p.owned.reset(new uint8_t[block_bytes * static_cast<std::size_t>(n_blocks)]());
  p.memory = p.owned.get();
  p.block_bytes = block_bytes;
  p.n_blocks = n_blocks;
  p.capacity = block_bytes * static_cast<std::size_t>(n_blocks);
  *base = p.memory;
  return Status();
}

Status LoopbackTransport::register_pool(void* base, std::size_t block_bytes, int64_t n_blocks) {
  std::lock_guard lock(hub_->mutex_);
  auto& p = hub_->pools_[static_cast<std::size_t>(rank_)];
  p.memory = static_cast<uint8_t*>(base);
  p.block_bytes = block_bytes;
  p.n_blocks = n_blocks;
  p.capacity = block_bytes * static_cast<std::size_t>(n_blocks);
  return Status();
}

// The pools are the hub's, seen alike by every endpoint: the owner's call or any other's changes it for all.
Status LoopbackTransport::relayout(int peer, std::size_t block_bytes, int64_t n_blocks) {
  std::lock_guard lock(hub_->mutex_);
  const bool known = peer >= 0 && peer < size();
  TANDEM_RETURN_IF_ERROR(check_relayout(peer, size(), known ? hub_->pools_[static_cast<std::size_t>(peer)].capacity : 0,
                                        block_bytes, n_blocks));
  auto& p = hub_->pools_[static_cast<std::size_t>(peer)];
  p.block_bytes = block_bytes;
  p.n_blocks = n_blocks;
  return Status();
}

Status LoopbackTransport::copy(int peer, std::span<const int32_t> src, std::span<const int32_t> dst,
                               const RowSlice* slice, std::span<const uint8_t> notification, XferId& id) {
  if (peer < 0 || peer >= size()) return Status(StatusCode::kInvalidArgument, "no peer " + std::to_string(peer));
  std::lock_guard lock(hub_->mutex_);
  auto& me = hub_->pools_[static_cast<std::size_t>(rank_)];
  auto& them = hub_->pools_[static_cast<std::size_t>(peer)];
  if (!me.memory || !them.memory) return Status(StatusCode::kUnavailable, "pool not created");
  TANDEM_RETURN_IF_ERROR(check_post(peer, size(), src, dst, me.n_blocks, them.n_blocks, notification.size(),
                                    capabilities().max_notification_bytes));
  TANDEM_RETURN_IF_ERROR(check_block_bytes(me.block_bytes, them.block_bytes, slice));
  for (const auto& r : coalesce(src, dst)) {
    if (!slice) {
      std::memcpy(them.memory + static_cast<std::size_t>(r.dst) * them.block_bytes,
                  me.memory + static_cast<std::size_t>(r.src) * me.block_bytes,
                  static_cast<std::size_t>(r.count) * me.block_bytes);
      continue;
    }
    // Row by row: the run's rows follow one another on both sides.
    const auto rows = static_cast<std::size_t>(slice->rows) * static_cast<std::size_t>(r.count);
    const std::size_t our_row = me.block_bytes / static_cast<std::size_t>(slice->rows);
    const std::size_t their_row = them.block_bytes / static_cast<std::size_t>(slice->rows);
    const uint8_t* from = me.memory + static_cast<std::size_t>(r.src) * me.block_bytes + slice->src_offset;
    uint8_t* to = them.memory + static_cast<std::size_t>(r.dst) * them.block_bytes + slice->dst_offset;
    for (std::size_t k = 0; k < rows; ++k) std::memcpy(to + k * their_row, from + k * our_row, slice->bytes);
  }
  id = next_id_++;
  outgoing_[id] = Outgoing{peer, std::vector<uint8_t>(notification.begin(), notification.end()), false,
                           XferState::kPending};
  return Status();
}

void LoopbackTransport::deliver(Outgoing& o) {
  if (o.state != XferState::kPending) return;
  std::lock_guard lock(hub_->mutex_);
  hub_->pools_[static_cast<std::size_t>(o.peer)].inbox.push_back({rank_, o.aborted, std::move(o.notification)});
  o.state = o.aborted ? XferState::kAborted : XferState::kDone;
}

Status LoopbackTransport::poll(XferId id, XferState& state) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return Status(StatusCode::kNotFound, "unknown transfer " + std::to_string(id));
  deliver(it->second);
  state = it->second.state;
  return Status();
}

Status LoopbackTransport::abort(XferId id) {
  auto it = outgoing_.find(id);
  if (it == outgoing_.end()) return Status(StatusCode::kNotFound, "unknown transfer " + std::to_string(id));
  if (it->second.state == XferState::kPending) it->second.aborted = true;
  deliver(it->second);
  return Status();
}

Status LoopbackTransport::progress(std::vector<Notification>& arrived) {
  for (auto& [id, o] : outgoing_) deliver(o);
  std::lock_guard lock(hub_->mutex_);
  auto& inbox = hub_->pools_[static_cast<std::size_t>(rank_)].inbox;
  while (!inbox.empty()) {
    arrived.push_back(std::move(inbox.front()));
    inbox.pop_front();
  }
  return Status();
}

Status LoopbackTransport::destroy() {
  for (auto& [id, o] : outgoing_) deliver(o);
  return Status();
}

}  // namespace tandem::mpi
