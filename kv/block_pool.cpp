#include "kv/block_pool.h"

#include <stdexcept>

namespace tandem::kv {

BlockPool::BlockPool(const KvLayout& layout, int64_t n_blocks)
    : layout_(layout), n_blocks_(n_blocks), owned_(new float[static_cast<std::size_t>(n_blocks * layout.block_floats())]()),
      base_(owned_.get()) {
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

BlockPool::BlockPool(const KvLayout& layout, int64_t n_blocks, float* base)
    : layout_(layout), n_blocks_(n_blocks), base_(base) {
  for (int64_t b = n_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));
}

std::optional<std::vector<int32_t>> BlockPool::allocate(int64_t n) {
  if (n > num_free()) return std::nullopt;
  std::vector<int32_t> out(free_.end() - n, free_.end());
  free_.resize(free_.size() - static_cast<std::size_t>(n));
  return out;
}

void BlockPool::release(const std::vector<int32_t>& blocks) {
  for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) free_.push_back(*it);
}

}  // namespace tandem::kv
