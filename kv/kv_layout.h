// The block-major KV layout shared by the engine, the transports and the
// offload tiers: one block = all layers x K and V x kv_heads x block_size
// tokens x head_dim, contiguous, so one block is one RMA put, one offload
// write and one hash; and inside it head-major, so one KV head's K (or V)
// of one layer is one contiguous run of block_size x head_dim: a
// tensor-parallel handoff between different widths moves a rank's heads as
// one piece per layer and K/V, not one per token.
//   pool: [n_blocks][layers][2][kv_heads][block_size][head_dim], float
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

  // Elements of one KV head's K (or V) of one layer in a block: block_size x head_dim.
  int64_t head_run() const { return block_size * head_dim; }
  int64_t block_elems() const { return layers * 2 * kv_heads * head_run(); }
  std::size_t block_bytes() const { return static_cast<std::size_t>(block_elems() * elem_bytes); }
  // A block's storage in floats: what the pool, the tiers and the store move
  // (for bf16 two elements share a float's four bytes; head_dim is even).
  int64_t block_floats() const { return block_elems() * elem_bytes / 4; }
  // A block as rows of every KV head's run (layers x K and V), for moving a range of heads.
  int64_t head_rows() const { return layers * 2; }
  std::size_t head_run_bytes() const { return static_cast<std::size_t>(head_run() * elem_bytes); }
  // Offset in elements of (block, layer, k_or_v (0 = K, 1 = V), KV head, slot in block).
  int64_t offset(int64_t block, int64_t layer, int kv, int64_t head, int64_t slot) const {
    return (((block * layers + layer) * 2 + kv) * kv_heads + head) * head_run() + slot * head_dim;
  }
};

}  // namespace tandem::kv
