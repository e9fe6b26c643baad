// The block-major KV layout shared by the engine, the transports and the
// offload tiers: one block = block_size tokens x all layers x K and V x
// kv_heads x head_dim, contiguous, so one block is one RMA put, one offload
// write and one hash.
//   pool: [n_blocks][layers][2][block_size][kv_heads][head_dim], float
// (or bf16, kv.dtype: the same order, two bytes an element).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kv {

struct KvLayout {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens
  int64_t elem_bytes = 4;   // 4: float32 elements; 2: bf16 (kv.dtype)

  // Elements in one token's K (or V) for one layer: kv_heads * head_dim.
  int64_t token_stride() const { return kv_heads * head_dim; }
  int64_t block_elems() const { return layers * 2 * block_size * token_stride(); }
  std::size_t block_bytes() const { return static_cast<std::size_t>(block_elems() * elem_bytes); }
  // A block's storage in floats: what the pool, the tiers and the store move
  // (for bf16 two elements share a float's four bytes; head_dim is even).
  int64_t block_floats() const { return block_elems() * elem_bytes / 4; }
  // Offset in elements of (block, layer, k_or_v (0 = K, 1 = V), slot in block).
  int64_t offset(int64_t block, int64_t layer, int kv, int64_t slot) const {
    return ((block * layers + layer) * 2 + kv) * block_size * token_stride() + slot * token_stride();
  }
};

}  // namespace tandem::kv
