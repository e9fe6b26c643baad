// G2: a bounded host-memory cache of KV blocks evicted from a worker's pool,
// found again by their chained hash (block_hash.h).
//
// Inclusive: a block copied back into the pool keeps its copy here, so a
// second eviction costs nothing. Least recently used first out. Every entry
// remembers how often its block was used (for the store's threshold) and
// whether it came from the disk store (for per-tier hit counts). Not
// thread-safe: the worker's thread owns it (KvTiers feeds it the store's reads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <unordered_map>
#include <vector>

namespace tandem::kv {

class HostCache {
 public:
  // capacity_blocks blocks of block_floats floats each; the memory is reserved, touched as it fills.
  HostCache(int64_t block_floats, int64_t capacity_blocks);

  int64_t capacity() const { return capacity_; }
  int64_t size() const { return static_cast<int64_t>(slot_of_.size()); }
  bool contains(uint64_t hash) const { return slot_of_.count(hash) > 0; }

  struct Entry {
    int64_t uses = 0;
    bool from_disk = false;
  };
  // Keeps a copy of block `data` (block_floats floats). An existing entry is
  // refreshed instead (most recently used, the larger use count, the new
  // origin), and `data` is not read (it may be null then). When full,
  // the least recently used entry is dropped.
  void put(uint64_t hash, const float* data, int64_t uses, bool from_disk);
  // Copies the block into dst and marks it most recently used; nullptr when absent.
  const Entry* get(uint64_t hash, float* dst);

  // Hashes stored and dropped since the last call (for rank 0's router), then a new log.
  void drain_events(std::vector<uint64_t>& stored, std::vector<uint64_t>& removed);

 private:
  struct Slot {
    uint64_t hash = 0;
    Entry entry;
    std::list<int64_t>::iterator lru;
  };
  int64_t block_floats_;
  int64_t capacity_;
  std::unique_ptr<float[]> slab_;  // [capacity][block_floats], float
  std::vector<Slot> slots_;
  std::vector<int64_t> free_;
  std::list<int64_t> lru_;  // slot ids, least recently used first
  std::unordered_map<uint64_t, int64_t> slot_of_;
  std::vector<uint64_t> stored_, removed_;
};

}  // namespace tandem::kv
