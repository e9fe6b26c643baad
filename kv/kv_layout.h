// The block-major KV layout shared by the engine, the transports and the
// offload tiers: one block = all layers x K and V x kv_heads x block_size
// tokens x head_dim, contiguous, so one block is one RMA put, one offload
// write and one hash; and inside it head-major, so one KV head's K (or V)
// of one layer is one contiguous run of block_size x head_dim: a
// tensor-parallel handoff between different widths moves a rank's heads as
// one piece per layer and K/V, not one per token.
//   pool: [n_blocks][layers][2][kv_heads][block_size][head_dim], float
// (or bf16, kv.dtype: the same order, two bytes an element). FP8 KV
// (kv.dtype = "fp8") keeps each token's row of one head as head_dim E4M3
// codes followed by that row's scale (float32, 4 bytes): row i of a head's
// run is [codes][scale], row_elems() = head_dim + 4 bytes, so a row, a head's
// run and a block still move, hash and store as plain bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::kv {

struct KvLayout {
  int64_t layers = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  // tokens
  int64_t elem_bytes = 4;   // 4: float32 elements; 2: bf16; 1: FP8 E4M3 with a scale per row (kv.dtype)

  static constexpr int64_t kRowScaleBytes = 4;  // an FP8 row's float32 scale, after its codes
  bool fp8() const { return elem_bytes == 1; }
  // Elements from one token's row of a head to the next: head_dim (and, for FP8, its scale's 4 bytes).
  int64_t row_elems() const { return head_dim + (fp8() ? kRowScaleBytes : 0); }
  // Elements of one KV head's K (or V) of one layer in a block: block_size rows.
  int64_t head_run() const { return block_size * row_elems(); }
  int64_t block_elems() const { return layers * 2 * kv_heads * head_run(); }
  std::size_t block_bytes() const { return static_cast<std::size_t>(block_elems() * elem_bytes); }
  // A block's storage in floats: what the pool, the tiers and the store move
  // (for bf16 two elements share a float's four bytes, head_dim being even; FP8 needs head_dim % 4 == 0).
  int64_t block_floats() const { return block_elems() * elem_bytes / 4; }
  // Bytes a K or V value takes, its row's scale shared out (FP8: 1 + 4 / head_dim).
  double bytes_per_value() const { return static_cast<double>(row_elems() * elem_bytes) / static_cast<double>(head_dim); }
  const char* dtype_name() const { return elem_bytes == 1 ? "fp8" : elem_bytes == 2 ? "bf16" : "f32"; }
  // A block as rows of every KV head's run (layers x K and V), for moving a range of heads.
  int64_t head_rows() const { return layers * 2; }
  std::size_t head_run_bytes() const { return static_cast<std::size_t>(head_run() * elem_bytes); }
  // Offset in elements of (block, layer, k_or_v (0 = K, 1 = V), KV head, slot in block).
  int64_t offset(int64_t block, int64_t layer, int kv, int64_t head, int64_t slot) const {
    return (((block * layers + layer) * 2 + kv) * kv_heads + head) * head_run() + slot * row_elems();
  }
};

}  // namespace tandem::kv
