// A worker's KV block pool: the memory (owned, or lent by a transport that
// registered it, e.g. an MPI window), reference counts, and the prefix cache.
//
// A full block may be published under its chained hash (block_hash.h). When
// its last user releases it, a published block is not freed but kept,
// evictable, in LRU order: a later request with the same prefix takes it
// back (lookup) instead of recomputing it. allocate() uses free blocks first,
// then evicts the least recently used cached ones. Not thread-safe: one
// worker's scheduler owns it.
//
// Below the pool may sit slower tiers (kv/tiers.h: host memory, the HDF5
// store): an evicted block is handed down before its memory is reused, and a
// lookup that runs out of cached blocks asks the tier below for the next ones
// and copies them in (onboarding) instead of leaving them to be recomputed.
#pragma once

#include <array>
#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/kv_layout.h"

namespace tandem::kv {

// Where a block of a lookup came from.
enum class Tier { kDevice = 0, kHost = 1, kDisk = 2 };
inline constexpr int kTiers = 3;

// What the pool needs from the tiers below it. Called on the pool's thread.
class LowerTier {
 public:
  virtual ~LowerTier() = default;
  // A published block is about to be reused: data is its content, uses how often it served.
  virtual void evicted(uint64_t hash, const float* data, int64_t uses) = 0;
  // A published block served once more (uses counts its computation as 1).
  virtual void used(uint64_t hash, const float* data, int64_t uses) = 0;
  virtual bool holds(uint64_t hash) const = 0;
  // Copies the block into dst when the tier holds it: where it came from and
  // its uses so far; nullopt when absent.
  struct Found {
    Tier tier = Tier::kHost;
    int64_t uses = 0;
  };
  virtual std::optional<Found> onboard(uint64_t hash, float* dst) = 0;
};

class BlockPool {
 public:
  // Owns n_blocks blocks of zeroed memory.
  BlockPool(const KvLayout& layout, int64_t n_blocks);
  // Uses memory it does not own: n_blocks * layout.block_bytes() bytes at base.
  BlockPool(const KvLayout& layout, int64_t n_blocks, float* base);

  const KvLayout& layout() const { return layout_; }
  int64_t capacity() const { return n_blocks_; }
  // Blocks allocate() can hand out: free ones and evictable cached ones.
  int64_t num_free() const { return static_cast<int64_t>(free_.size() + lru_.size()); }
  int64_t num_cached() const { return static_cast<int64_t>(by_hash_.size()); }
  float* data() { return base_; }
  const float* data() const { return base_; }

  // n block ids (reference count 1), or nullopt (and nothing taken) when fewer are available.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  // Drops one reference from each block.
  void release(const std::vector<int32_t>& blocks);

  // The cached blocks holding the longest prefix of `hashes`, each with one
  // more reference; with a lower tier, blocks found there are copied in.
  // from (optional): how many of them came from each Tier.
  std::vector<int32_t> lookup(std::span<const uint64_t> hashes, std::array<int64_t, kTiers>* from = nullptr);
  bool contains(uint64_t hash) const { return by_hash_.count(hash) > 0; }
  // The tiers below (not owned; null: none).
  void set_lower(LowerTier* lower) { lower_ = lower; }
  // Publishes a full, referenced block under its hash (no-op if the hash is
  // already cached). computed_here: its computation counts as its first use
  // (false for KV another rank computed and sent: that rank counts it).
  void publish(int32_t block, uint64_t hash, bool computed_here = true);

  // Hashes published and evicted since the last call (what rank 0's KV-aware
  // router learns from this worker), then starts a new log.
  void drain_events(std::vector<uint64_t>& stored, std::vector<uint64_t>& removed);
  bool has_events() const { return !stored_.empty() || !removed_.empty(); }

 private:
  struct Meta {
    int32_t refs = 0;
    uint64_t hash = 0;  // 0: not published
    int64_t uses = 0;   // computations and lookups it served, for the store's threshold
    std::list<int32_t>::iterator lru;  // valid when refs == 0 and published
  };
  void unpublish(int32_t block);

  KvLayout layout_;
  int64_t n_blocks_;
  std::shared_ptr<void> owned_;  // common/big_alloc.h: zero until written
  float* base_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
  std::vector<Meta> meta_;
  std::list<int32_t> lru_;     // cached blocks nobody uses, least recently used first
  std::unordered_map<uint64_t, int32_t> by_hash_;
  std::vector<uint64_t> stored_, removed_;
  LowerTier* lower_ = nullptr;
};

}  // namespace tandem::kv
