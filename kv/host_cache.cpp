#include "kv/host_cache.h"

#include <algorithm>
#include <cstring>

namespace tandem::kv {

HostCache::HostCache(int64_t block_floats, int64_t capacity_blocks)
    : block_floats_(block_floats), capacity_(capacity_blocks < 0 ? 0 : capacity_blocks),
      slab_(capacity_ > 0 ? new float[static_cast<std::size_t>(capacity_ * block_floats)] : nullptr),
      slots_(static_cast<std::size_t>(capacity_)) {
  for (int64_t s = capacity_ - 1; s >= 0; --s) free_.push_back(s);
}

void HostCache::put(uint64_t hash, const float* data, int64_t uses, bool from_disk) {
  if (capacity_ == 0 || hash == 0) return;
  if (auto it = slot_of_.find(hash); it != slot_of_.end()) {
    Slot& s = slots_[static_cast<std::size_t>(it->second)];
    lru_.splice(lru_.end(), lru_, s.lru);
    s.entry.uses = std::max(s.entry.uses, uses);
    s.entry.from_disk = from_disk;  // where its latest copy came from
    return;
  }
  if (free_.empty()) {  // drop the least recently used
    const int64_t victim = lru_.front();
    lru_.pop_front();
    Slot& v = slots_[static_cast<std::size_t>(victim)];
    slot_of_.erase(v.hash);
    removed_.push_back(v.hash);
    free_.push_back(victim);
  }
  const int64_t id = free_.back();
  free_.pop_back();
  Slot& s = slots_[static_cast<std::size_t>(id)];
  s.hash = hash;
  s.entry = {uses, from_disk};
  s.lru = lru_.insert(lru_.end(), id);
  std::memcpy(slab_.get() + id * block_floats_, data, static_cast<std::size_t>(block_floats_) * sizeof(float));
  slot_of_.emplace(hash, id);
  stored_.push_back(hash);
}

const HostCache::Entry* HostCache::get(uint64_t hash, float* dst) {
  auto it = slot_of_.find(hash);
  if (it == slot_of_.end()) return nullptr;
  Slot& s = slots_[static_cast<std::size_t>(it->second)];
  lru_.splice(lru_.end(), lru_, s.lru);
  std::memcpy(dst, slab_.get() + it->second * block_floats_, static_cast<std::size_t>(block_floats_) * sizeof(float));
  return &s.entry;
}

void HostCache::drain_events(std::vector<uint64_t>& stored, std::vector<uint64_t>& removed) {
  stored = std::move(stored_);
  removed = std::move(removed_);
  stored_.clear();
  removed_.clear();
}

}  // namespace tandem::kv
