// The CUDA backend's operations, one per .cu file (as ggml's CUDA backend).
// Each enqueues its kernel on `stream` and returns at once: no host
// synchronisation inside a step. Activations are float32, row-major; shapes
// in elements. The KV pool is the block-major layout of kv/kv_layout.h in
// device memory, of float32, bf16 or FP8 elements (PoolShape::kv):
//   pool: [n_blocks][layers][2][kv_heads][block_size][row], row = head_dim
// (FP8: head_dim codes and the row's float32 scale, PoolShape::row())
// A row (one token of one sequence in the step) finds its sequence's blocks
// at tables + table_of[row], and its position at positions[row].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "runtime/model/dtype.h"

namespace tandem::runtime::cuda {

struct PoolShape {
  int64_t layers = 0, kv_heads = 0, head_dim = 0, block_size = 16;
  // The pool's elements: kF32, kBF16, or kF8E4M3 (kv::KvLayout::elem_bytes 4, 2 or 1: a row of head_dim codes,
  // then its float32 scale, kv::KvLayout::row_elems).
  DType kv = DType::kF32;
  __host__ __device__ int64_t row() const { return head_dim + (kv == DType::kF8E4M3 ? 4 : 0); }
};

// The rows' view of the paged pool, all in device memory.
struct RowTables {
  const int32_t* positions = nullptr;  // [rows]
  const int32_t* table_of = nullptr;   // [rows]: offset of the row's block table in `tables`
  const int32_t* tables = nullptr;     // every sequence's block table, one after another
};

// out[r][i] = table[tokens[r]][i] as float; table: [vocab][hidden] of `dtype`.
void embedding(const void* table, DType dtype, const int32_t* tokens, int64_t rows, int64_t hidden, float* out,
               cudaStream_t stream);

// The residual and the norm after it, row by row (`rows` rows of n): when y
// is given, x[r] += y[r] (+ bias, when given); then out[r] = w * x[r] /
// sqrt(mean(x[r]^2) + eps), written as out_type (float32, or rounded to
// bf16/f16 for the product that takes it).
void add_rms_norm(float* x, const float* y, const float* bias, const float* w, int64_t rows, int64_t n, float eps,
                  DType out_type, void* out, cudaStream_t stream);

// From the fused q/k/v product (qkv: [rows][(heads + 2 * kv_heads) * head_dim],
// q heads then k heads then v heads) to attention's inputs, per head: + bias
// (same layout, or null); RMSNorm of each q and k head by q_norm / k_norm
// ([head_dim], or null); rotary embedding, rotate-half form, at the row's
// position (inv_freq: [head_dim / 2]; angles in float32 and cos/sin in double,
// as the CPU backend); then q to q_out ([rows][heads * head_dim]) and k, v
// into the row's slot of `layer` in the pool (FP8: each K and V row
// quantized as the CPU's quantize_fp8_row, the same bytes). head_dim even, <= 512.
void qkv_rope(const float* qkv, int64_t rows, int64_t heads, const float* bias, const float* q_norm, const float* k_norm,
              float eps, const float* inv_freq, RowTables rt, PoolShape shape, int64_t layer, void* pool, float* q_out,
              cudaStream_t stream);

// Where decode attention split over positions keeps its parts: partial
// [rows][heads][splits][head_dim + 2] floats, counters [rows][heads] ints that
// start at zero (each launch leaves them at zero). splits <= 1 or null
// buffers: one block per (row, head), no scratch.
inline constexpr int64_t kMaxAttentionSplits = 32;
struct AttentionScratch {
  float* partial = nullptr;
  int32_t* counters = nullptr;
  int64_t splits = 1;
};
// Splits that give `rows` x `heads` about four blocks per SM (1 when they already do), at most kMaxAttentionSplits.
int64_t attention_splits(int64_t rows, int64_t heads, int sms);

// Causal attention of each row's `heads` query heads (q: [rows][heads *
// head_dim]) over its sequence's positions [first, pos] in `layer` (first > 0
// only with a sliding window), GQA by kv head = head / (heads / kv_heads);
// out: [rows][heads * head_dim]. head_dim <= 256.
// only_rows (optional, device): run for rows only_rows[0..rows) instead of 0..rows.
void attention(const float* q, int64_t rows, int64_t heads, int64_t sliding_window, RowTables rt, PoolShape shape,
               int64_t layer, const void* pool, float* out, cudaStream_t stream, const int32_t* only_rows = nullptr,
               AttentionScratch scratch = {});

// The same attention for prefill rows, in tiles: tiles[k] is the first row of
// tile k and tiles[n_tiles + k] its row count (<= kTileQ consecutive rows of
// one sequence). Equal to attention() within float rounding.
inline constexpr int64_t kTileQ = 16, kTileK = 32;
void attention_tiles(const float* q, int64_t heads, int64_t sliding_window, RowTables rt, const int32_t* tiles,
                     int64_t n_tiles, PoolShape shape, int64_t layer, const void* pool, float* out,
                     cudaStream_t stream);
// The same on the tensor cores: q, K and V rounded to bf16, products
// accumulated and the softmax kept in float32 (within bf16 rounding of
// attention_tiles). For bf16/f16 models; head_dim a multiple of 16, <= 256.
void attention_tiles_tc(const float* q, int64_t heads, int64_t sliding_window, RowTables rt, const int32_t* tiles,
                        int64_t n_tiles, PoolShape shape, int64_t layer, const void* pool, float* out,
                        cudaStream_t stream);

// out[r][i] = silu(g) * u with g = gate_up[r][i], u = gate_up[r][n + i]
// (the fused gate/up product), for `rows` rows of n, written as out_type.
void swiglu(const float* gate_up, int64_t rows, int64_t n, DType out_type, void* out, cudaStream_t stream);

// x[i] += y[i], n elements.
void add(float* x, const float* y, int64_t n, cudaStream_t stream);

// out[i] = the parts' sum (parts: [count][n], count 1, 2, 4 or 8) in the
// fixed pairwise tree, ((p0 + p1) + (p2 + p3)) + ..., as the CPU's group sum
// (runtime/cpu/row_parallel.h sum_in_tree): a tensor-parallel group's
// partial sums of a row-parallel product, added in rank order.
void sum_parts(const float* parts, int count, int64_t n, float* out, cudaStream_t stream);

// out[i] = x[i] rounded to bf16 or f16 (round to nearest even), n elements.
void to_half(const float* x, int64_t n, DType dtype, void* out, cudaStream_t stream);

// out[r] = the index of row r's largest value (rows of n), ties to the lowest
// index, as the host sampler's greedy pick.
void argmax(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream);

// One row's draw (runtime/engine/backend.h DeviceDraw): temperature 0 is greedy.
struct DrawParams {
  float temperature = 0.0f, min_p = 0.0f;
  double u = 0.0;  // the request's uniform number for this step, in [0, 1)
};
// out[r] = the token sample_token would draw from row r (rows of n logits)
// with no penalties, top-k or top-p: greedy, or temperature and min-p.
void draw(const float* logits, int64_t rows, int64_t n, const DrawParams* params, int32_t* out, cudaStream_t stream);

// out[i] = x[rows[i]], rows of `width`.
void gather_rows(const float* x, const int32_t* rows, int64_t n_rows, int64_t width, float* out, cudaStream_t stream);

// Products of our own (products.cu): y = x W^T for groups of rows, each
// group with its own W. A mixture of experts' grouped products (a group per
// local expert) and its router, and every product of 8-bit weights (one
// group), which stay 8-bit on the device. Float32 arithmetic on the
// weights' values (an 8-bit weight's value is its code times its scale, one
// float32 product, as the CPU's), each output one sum over k in order, fmaf
// by fmaf: a row's result never depends on the other rows of its step.

// Rows grouped (device arrays): group j has positions [offsets[j],
// offsets[j + 1]), order[position] the row (or slot) each stands for, its
// tiles of kProductTileRows positions [tile_start[j], tile_start[j + 1]).
inline constexpr int64_t kProductTileRows = 32;
struct RowGroups {
  int32_t* order = nullptr;
  int32_t* offsets = nullptr;  // null: one group over rows [0, Product::rows) in order (a dense product)
  int32_t* tile_start = nullptr;
};

// An 8-bit W's scales, one row of them per row of W (the groups' Ws one
// after another): weight (n, k) of group j is code x grid[(j N + n) ld +
// (k + offset) / block_cols].
struct ProductScales {
  const float* grid = nullptr;
  int64_t ld = 1, block_cols = 1, offset = 0;
};

// For group j and each of its positions i: out row = in row x W_j^T, W_j =
// w + j * n * k elements of w_dtype ([n][k]: float32, bf16, f16, or FP8
// E4M3 / INT8 codes with their scales). The in row is order[i] / top_k
// (gather: a row's hidden state for a slot) or i; with swiglu it is [2k]
// floats, gate then up, and its element kk is silu(gate) * up (as swiglu()).
// The out row is order[i] (scatter: a slot) or i.
struct Product {
  const float* in = nullptr;
  bool gather = false, swiglu = false, scatter = false;
  int64_t top_k = 1;
  const void* w = nullptr;
  DType w_dtype = DType::kF32;
  ProductScales scales;  // 8-bit w only
  int64_t n = 0, k = 0;
  float* out = nullptr;
  int64_t rows = 0;  // a dense product's (RowGroups::offsets null)
};
// Rows [n0, n0 + n) of an 8-bit W ([rows][k] FP8 E4M3 or INT8 codes, one
// group, its scales as products() reads them) into out as bf16 ([n][k]):
// each weight's value as products() computes it, rounded to nearest even.
// A long product's weights for the tensor cores (cuda_model.cpp gemm()).
void dequantize_bf16(const void* codes, DType dtype, const ProductScales& s, int64_t n0, int64_t n, int64_t k, void* out,
                     cudaStream_t stream);
// Hopper's FP8 products (fp8_gemm.h) take their input quantized in groups
// of kFp8Group columns and its rows in eights (cuBLASLt's block scaling wants
// the scales' dimensions multiples of 4, and NVIDIA's TransformerEngine
// gives an operand scaled in 1 x 128 groups a multiple of 8 rows, "observed"
// to be needed: rows in fours could leave some batch sizes with no
// algorithm): fp8_scale_ld(rows) rows, the scales laid out group by group,
// row fastest.
inline constexpr int64_t kFp8Group = 128;
inline int64_t fp8_scale_ld(int64_t rows) { return (rows + 7) / 8 * 8; }
// codes [fp8_scale_ld(rows)][k] and scales[g * fp8_scale_ld(rows) + r] of x
// [rows][k] (k a multiple of kFp8Group): group g of row r as E4M3 codes of x /
// scale, scale = its max |x| / 448 (as kernels.h quantize_fp8_row); the
// padding rows zero codes and scale 0.
void quantize_groups_fp8(const float* x, int64_t rows, int64_t k, uint8_t* codes, float* scales, cudaStream_t stream);
// A bound of the tiles `groups` groups of `rows` positions in all can make (the launch's grid).
int64_t product_tiles(int64_t rows, int64_t groups);
void products(const Product& p, const RowGroups& g, int64_t count, int64_t max_tiles, cudaStream_t stream);

// A mixture of experts' layer (moe.cu), in launches with no host wait: the
// router's product (products()), moe_route, moe_group, the experts' products
// for gate/up and for down (products()), moe_combine. Slots are row * top_k + k.

// Each row's top_k experts (ties to the lower id) and their weights, from
// the router's logits ([rows][experts], overwritten by the softmax): float32
// softmax as the CPU's (max, exp, a sequential sum, divide), renormalised
// over the k when `renormalise`. expert, weight: [rows][top_k], slot order.
void moe_route(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise, int32_t* expert,
               float* weight, cudaStream_t stream);

// The slots of this rank's experts [first, first + count) as row groups
// (within an expert in no set order: each product row depends on its own
// input only, and goes back to its slot), a group per local expert. Device
// arrays: order [slots], offsets and tile_start [count + 1]. counted
// (optional, [experts]): += the slots routed to each expert. experts <= kMaxExperts.
inline constexpr int64_t kMaxExperts = 1024;
void moe_group(const int32_t* expert, int64_t slots, int64_t experts, int64_t first, int64_t count, RowGroups g,
               unsigned long long* counted, cudaStream_t stream);

// out[r] = sum over k, in slot order, of weight[s] x slot s's expert output
// (s = r * top_k + k), fmaf by fmaf; the output read from parts +
// (expert[s] / experts_per_rank) * part_stride, at s * hidden: the part of
// the rank that owns the expert (one part: experts_per_rank = experts).
void moe_combine(const float* parts, int64_t part_stride, int64_t experts_per_rank, const int32_t* expert,
                 const float* weight, int64_t rows, int64_t top_k, int64_t hidden, float* out, cudaStream_t stream);

}  // namespace tandem::runtime::cuda
