// The block-major KV layout shared by the engine, the transports and the
// offload tiers: one block = block_size tokens x all layers x K and V x
// kv_heads x head_dim, contiguous, so one block is one RMA put, one offload
// write and one hash.
//   pool: [n_blocks][layers][2][block_size][kv_heads][head_dim], float
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kv {

struct KvLayout {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens

  // Floats in one token's K (or V) for one layer: kv_heads * head_dim.
  int64_t token_stride() const { return kv_heads * head_dim; }
  // Floats in one block.
  int64_t block_floats() const { return layers * 2 * block_size * token_stride(); }
  std::size_t block_bytes() const { return static_cast<std::size_t>(block_floats()) * sizeof(float); }
  // Offset in floats of (block, layer, k_or_v (0 = K, 1 = V), slot in block).
  int64_t offset(int64_t block, int64_t layer, int kv, int64_t slot) const {
    return ((block * layers + layer) * 2 + kv) * block_size * token_stride() + slot * token_stride();
  }
};

}  // namespace tandem::kv
