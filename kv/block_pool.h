// A worker's KV block pool: the memory (owned, or lent by a transport that
// registered it, e.g. an MPI window) and a free list of block ids.
// Not thread-safe: one worker's scheduler owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "kv/kv_layout.h"

namespace tandem::kv {

class BlockPool {
 public:
  // Owns n_blocks blocks of zeroed memory.
  BlockPool(const KvLayout& layout, int64_t n_blocks);
  // Uses memory it does not own: n_blocks * layout.block_bytes() bytes at base.
  BlockPool(const KvLayout& layout, int64_t n_blocks, float* base);

  const KvLayout& layout() const { return layout_; }
  int64_t capacity() const { return n_blocks_; }
  int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
  float* data() { return base_; }
  const float* data() const { return base_; }

  // n block ids, or nullopt (and nothing taken) when fewer are free.
  std::optional<std::vector<int32_t>> allocate(int64_t n);
  void release(const std::vector<int32_t>& blocks);

 private:
  KvLayout layout_;
  int64_t n_blocks_;
  std::unique_ptr<float[]> owned_;
  float* base_;
  std::vector<int32_t> free_;  // a stack: the most recently freed block is reused first
};

}  // namespace tandem::kv
