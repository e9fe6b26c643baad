// The tiers under a worker's pool (G1): host memory (G2, HostCache) and the
// persistent HDF5 store (G3, DiskStore), with the policies that move blocks
// between them:
//  - down: a block evicted from the pool is copied to G2 (LRU, bounded); a
//    block that has served store_min_hits times (its computation counts as
//    one) is queued for G3, once — Dynamo's "seen twice" filter by default;
//  - up: a pool lookup copies G2 blocks in (BlockPool::lookup); G3 blocks
//    come up to G2 first, read ahead by prefetch() when a request arrives.
// All G3 I/O runs on one background thread (write-behind and read-ahead), so
// the worker's step loop never waits on the filesystem: a request whose
// blocks are still being read waits aside (WorkerCore), the others run. The
// write queue is bounded; past it, writes are dropped and counted.
// The pool's thread calls everything here; only the I/O thread is internal.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "kv/block_pool.h"
#include "kv/disk_store.h"
#include "kv/host_cache.h"

namespace tandem::kv {

// How block bytes cross between the pool's memory and host memory: plain
// memcpy for a host pool; a device pool's backend passes its copy (e.g.
// cudaMemcpy, synchronous). to_pool: host -> pool, else pool -> host.
using PoolCopy = std::function<void(void* dst, const void* src, std::size_t bytes, bool to_pool)>;

struct TierOptions {
  int64_t host_bytes = 0;         // G2 size; 0: off (a staging area for store reads remains when G3 is on)
  DiskStore::Options store;       // store.dir empty: no G3
  int64_t store_min_hits = 2;     // uses before a block is written to G3
  int64_t max_queued_bytes = 256ll << 20;  // write-behind queue bound
  PoolCopy pool_copy;             // empty: the pool is in host memory
};

// Counters since the start (blocks, bytes, seconds of copying).
struct TierStats {
  int64_t host_offloaded = 0;       // G1 -> G2
  int64_t host_onboarded = 0;       // G2 -> G1, blocks that were in G2 by eviction
  int64_t disk_onboarded = 0;       // G2 -> G1, blocks read from G3
  double host_bytes = 0, host_seconds = 0;  // G1 <-> G2 copies
  int64_t disk_read = 0, disk_read_failed = 0;  // G3 -> G2
  double disk_read_bytes = 0, disk_read_seconds = 0;
  int64_t disk_written = 0, disk_write_dropped = 0;
  double disk_write_bytes = 0, disk_write_seconds = 0;
  int64_t store_blocks_at_open = 0, store_files_at_open = 0;
  int64_t store_pruned_files = 0;  // deleted (least recently used) to stay under kv.store_max_gib
  double store_pruned_bytes = 0;
  bool store_enabled = false, store_writable = false;
  int64_t host_capacity_blocks = 0;

  // Every field by name, as f(name, pointer to member): one list for
  // serialising, reading back and summing over ranks.
  template <class F>
  static void each_field(F&& f) {
    f("host_offloaded", &TierStats::host_offloaded);
    f("host_onboarded", &TierStats::host_onboarded);
    f("disk_onboarded", &TierStats::disk_onboarded);
    f("host_bytes", &TierStats::host_bytes);
    f("host_seconds", &TierStats::host_seconds);
    f("disk_read", &TierStats::disk_read);
    f("disk_read_failed", &TierStats::disk_read_failed);
    f("disk_read_bytes", &TierStats::disk_read_bytes);
    f("disk_read_seconds", &TierStats::disk_read_seconds);
    f("disk_written", &TierStats::disk_written);
    f("disk_write_dropped", &TierStats::disk_write_dropped);
    f("disk_write_bytes", &TierStats::disk_write_bytes);
    f("disk_write_seconds", &TierStats::disk_write_seconds);
    f("store_blocks_at_open", &TierStats::store_blocks_at_open);
    f("store_files_at_open", &TierStats::store_files_at_open);
    f("pruned_files", &TierStats::store_pruned_files);
    f("pruned_bytes", &TierStats::store_pruned_bytes);
    f("store_enabled", &TierStats::store_enabled);
    f("store_writable", &TierStats::store_writable);
    f("host_capacity_blocks", &TierStats::host_capacity_blocks);
  }
};

class KvTiers final : public LowerTier {
 public:
  // Opens the store (indexing its files) before returning; problems are
  // appended to `warnings`, one line each.
  KvTiers(const KvLayout& layout, TierOptions options, std::vector<std::string>& warnings);
  ~KvTiers() override;
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  // LowerTier: what the pool sees.
  bool holds(uint64_t hash) const override { return host_.contains(hash); }
  void evicted(uint64_t hash, const float* data, int64_t uses) override;
  void used(uint64_t hash, const float* data, int64_t uses) override;
  std::optional<Found> onboard(uint64_t hash, float* dst) override;
  // Whether evicted() and used() would read the block's data now (a caller
  // that must first fetch it, a tensor-parallel leader, asks; else data may be null).
  bool reads_evicted(uint64_t hash) const { return host_.capacity() > 0 && !host_.contains(hash); }
  bool reads_used(uint64_t hash, int64_t uses) const {
    return store_ && store_->enabled() && stats_.store_writable && uses >= o_.store_min_hits && !in_store_.count(hash);
  }

  // Starts reading from G3 the leading blocks of `hashes` that neither the
  // pool nor G2 holds. True when none of them has to be waited for.
  bool prefetch(std::span<const uint64_t> hashes, const BlockPool& pool);
  // True while one of `hashes` is being read.
  bool reading(std::span<const uint64_t> hashes) const;
  bool reading_any() const { return !in_flight_.empty(); }
  // Moves finished reads into G2; the I/O thread's warnings come out here.
  void poll(std::vector<std::string>& warnings);
  // Writes what is queued, finishes the store's file, stops the I/O thread;
  // the last warnings come out. Idempotent.
  void close(std::vector<std::string>& warnings);

  bool store_enabled() const { return store_ && store_->enabled(); }
  // Every block G3 holds (for rank 0's router), as indexed at open.
  std::vector<uint64_t> store_index() const { return store_ ? initial_index_ : std::vector<uint64_t>(); }
  // Changes since the last call: G2 stored/dropped, G3 queued for writing.
  void drain_events(std::vector<uint64_t>& host_stored, std::vector<uint64_t>& host_removed,
                    std::vector<uint64_t>& disk_stored);
  TierStats stats() const;

 private:
  struct Write {
    uint64_t hash;
    std::vector<float> data;
  };
  struct Read {
    uint64_t hash;
    std::vector<float> data;  // empty: failed
    double seconds;
  };
  void io_loop();
  // The block at `data` in the pool, readable from the host (itself, or a copy in staging_).
  const float* host_view(const float* data);

  KvLayout layout_;
  TierOptions o_;
  HostCache host_;
  std::unique_ptr<DiskStore> store_;
  std::vector<uint64_t> initial_index_;
  std::unordered_set<uint64_t> in_store_;   // indexed at open, plus every write queued since
  std::unordered_set<uint64_t> in_flight_;  // reads asked for, not yet polled
  std::vector<uint64_t> disk_new_;
  TierStats stats_;
  std::vector<float> staging_;  // one block, for a device pool's copies

  // Shared with the I/O thread.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<uint64_t> reads_;
  std::deque<Write> writes_;
  std::vector<std::vector<float>> spare_;  // block buffers done with, reused for the next reads and writes
  std::vector<Read> done_;
  std::vector<std::string> io_warnings_;
  int64_t queued_bytes_ = 0;
  int64_t written_ = 0;
  double write_bytes_ = 0, write_seconds_ = 0;
  int64_t pruned_files_ = 0;
  double pruned_bytes_ = 0;
  bool stop_ = false;
  bool write_stopped_ = false;
  std::thread io_;
};

}  // namespace tandem::kv
