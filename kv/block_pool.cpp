#include "kv/block_pool.h"

#include "common/big_alloc.h"

namespace tandem::kv {

BlockPool::BlockPool(const KvLayout& layout, int64_t n_blocks)
    : layout_(layout),
      n_blocks_(n_blocks),
      owned_(allocate_big(static_cast<std::size_t>(n_blocks) * layout.block_bytes())),
      base_(static_cast<float*>(owned_.get())),
      meta_(static_cast<std::size_t>(n_blocks)) {
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

BlockPool::BlockPool(const KvLayout& layout, int64_t n_blocks, float* base)
    : layout_(layout), n_blocks_(n_blocks), base_(base), meta_(static_cast<std::size_t>(n_blocks)) {
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

void BlockPool::unpublish(int32_t block) {
  Meta& m = meta_[static_cast<std::size_t>(block)];
  if (m.hash == 0) return;
  by_hash_.erase(m.hash);
  removed_.push_back(m.hash);
  m.hash = 0;
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int64_t n) {
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> out;
  out.reserve(static_cast<std::size_t>(n));
  while (static_cast<int64_t>(out.size()) < n && !free_.empty()) {
    out.push_back(free_.back());
    free_.pop_back();
  }
  while (static_cast<int64_t>(out.size()) < n) {  // evict the least recently used cached blocks
    const int32_t b = lru_.front();
    lru_.pop_front();
    const Meta& m = meta_[static_cast<std::size_t>(b)];
    if (lower_ && m.hash != 0) lower_->evicted(m.hash, base_ + b * layout_.block_floats(), m.uses);
    unpublish(b);
    out.push_back(b);
  }
  for (int32_t b : out) meta_[static_cast<std::size_t>(b)].refs = 1;
  return out;
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
    Meta& m = meta_[static_cast<std::size_t>(*it)];
    if (--m.refs > 0) continue;
    if (m.hash != 0) m.lru = lru_.insert(lru_.end(), *it);
    else free_.push_back(*it);
  }
}

std::vector<int32_t> BlockPool::lookup(std::span<const uint64_t> hashes, std::array<int64_t, kTiers>* from) {
  std::vector<int32_t> out;
  for (uint64_t h : hashes) {
    if (auto it = by_hash_.find(h); it != by_hash_.end()) {
      Meta& m = meta_[static_cast<std::size_t>(it->second)];
      if (m.refs++ == 0) lru_.erase(m.lru);
      ++m.uses;
      if (lower_) lower_->used(h, base_ + it->second * layout_.block_floats(), m.uses);
      out.push_back(it->second);
      if (from) ++(*from)[static_cast<int>(Tier::kDevice)];
      continue;
    }
    // Not here: onboard it from below into a block of its own, if there is one to take.
    if (!lower_ || num_free() == 0 || !lower_->holds(h)) break;
    auto got = allocate(1);
    const int32_t b = got->front();
    float* dst = base_ + b * layout_.block_floats();
    const auto found = lower_->onboard(h, dst);
    if (!found) {
      release(*got);
      break;
    }
    publish(b, h);
    Meta& m = meta_[static_cast<std::size_t>(b)];
    m.uses = found->uses + 1;
    lower_->used(h, dst, m.uses);
    out.push_back(b);
    if (from) ++(*from)[static_cast<int>(found->tier)];
  }
  return out;
}

void BlockPool::publish(int32_t block, uint64_t hash, bool computed_here) {
  Meta& m = meta_[static_cast<std::size_t>(block)];
  if (m.hash != 0 || hash == 0 || by_hash_.count(hash)) return;
  m.hash = hash;
  m.uses = computed_here ? 1 : 0;
  by_hash_.emplace(hash, block);
  stored_.push_back(hash);
  if (lower_ && computed_here) lower_->used(hash, base_ + block * layout_.block_floats(), 1);
}

void BlockPool::drain_events(std::vector<uint64_t>& stored, std::vector<uint64_t>& removed) {
  stored = std::move(stored_);
  removed = std::move(removed_);
  stored_.clear();
  removed_.clear();
}

}  // namespace tandem::kv
