#include "kv/block_hash.h"

#include <xxhash.h>

namespace tandem::kv {

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

std::vector<uint64_t> full_block_hashes(std::span<const int32_t> tokens, int64_t block_size) {
  std::vector<uint64_t> out;
  uint64_t parent = kRootHash;
  for (std::size_t b = 0; (b + 1) * static_cast<std::size_t>(block_size) <= tokens.size(); ++b) {
    parent = block_hash(parent, tokens.subspan(b * static_cast<std::size_t>(block_size), static_cast<std::size_t>(block_size)));
    out.push_back(parent);
  }
  return out;
}

}  // namespace tandem::kv
