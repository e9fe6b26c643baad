// Chained block hashes: a full block's hash covers its tokens and, through
// its parent's hash, every token before it. Equal hashes mean equal prefixes,
// on any rank and in any job (xxHash3, fixed seed).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem::kv {

inline constexpr uint64_t kRootHash = 0x5441'4E44'454D'0001ull;  // parent of a sequence's first block

uint64_t block_hash(uint64_t parent, std::span<const int32_t> tokens);

// Hashes of the full blocks of tokens (a partial last block has none).
std::vector<uint64_t> full_block_hashes(std::span<const int32_t> tokens, int64_t block_size);

}  // namespace tandem::kv
