// The CPU backend's inner loops, behind one table chosen at run time by ISA
// (AVX-512, else AVX2+FMA+F16C, else scalar) — never by batch shape — and
// by the matrix products' arithmetic (MatmulMode, below).
//
// Batch invariance, bit for bit: every reduction has one fixed order that
// depends only on its length. A dot product of length K keeps 8 lanes (lane j
// sums k = j, j+8, j+16, ... with fused multiply-add, in increasing k), folds
// them as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)), then adds the K % 8 tail with
// FMA in order. The AVX-512, AVX2 and scalar tables compute exactly this, so they agree
// bitwise, and so does a matrix row whether it is computed alone, in a tile of
// four, or on another thread.
#pragma once

#include <cstdint>

#include "runtime/model/weights.h"

namespace tandem::runtime::cpu {

// One KV head's queries over one sequence's keys and values: the work of KernelTable::attend. Query (row i,
// head j), i < rows, j < heads, is at q + i * ldq_row + j * ldq_head (head_dim floats; its output at the same
// offsets from out), at position pos0 + i, and sees positions [first, pos0 + i] with first = max(0, pos0 + i -
// window + 1) under a sliding window (window > 0), else 0. keys[p - base] and values[p - base] are position p's
// rows (of type kv, as dot_rows takes them) for p in [base, pos0 + rows); base % 32 == 0; a row no query sees
// may be nullptr.
struct AttendTask {
  const float* q;
  float* out;
  int64_t ldq_row, ldq_head, rows, heads, head_dim;
  int64_t pos0, window, base;
  DType kv;
  const void* const* keys;
  const void* const* values;
  float scale;  // the scores' factor, as softmax takes it
};
// KernelTable::attend of the kBf16Amx tables (attention_bf16amx.cpp): on AMX-BF16 tiles (only where
// amx_bf16_kernels() is not null), and the same bits on AVX-512 FMAs (AVX512-BF16 and VBMI).
void attend_bf16amx_tiles(const AttendTask& task);
void attend_bf16amx_fma(const AttendTask& task);

struct KernelTable {
  const char* name;
  // y[m * ldy + n] = dot(x[m * ldx ...], W row n) for m in [0, M), n in [n0, n1).
  // x: float [M][K] (K = W.cols); W: [N][K] in f32, bf16 or f16.
  void (*matmul)(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                 int64_t ldy);
  float (*dot)(const float* a, const float* b, int64_t n);
  // y[i] = fma(a, x[i], y[i])
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // Attention scores of M queries (q + m * ldq) against the same rows, whose
  // elements are of type kv (float32, bf16 or f16 KV, widened exactly; or
  // FP8 KV rows, widened as widen_fp8_row does): out[m * ldo + r] = dot(q +
  // m * ldq, rows[r], n), bitwise as dot() on the widened rows, faster.
  void (*dot_rows)(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count,
                   int64_t n, float* out, int64_t ldo);
  // M weighted sums of the same rows (of type kv, as above): for each m, o = out + m *
  // ldo is set to 0 (unless accumulate), then for r in order axpy(w[m * ldw +
  // r], rows[r], o, n) — bitwise as that loop on the widened rows, with o kept
  // in registers.
  void (*weighted_sum)(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count,
                       int64_t n, bool accumulate, float* out, int64_t ldo);
  // The row-parallel product (row_parallel.h): parts[c] is column chunk c of
  // one weight matrix (all of W.rows), and x's columns for part c follow part
  // c - 1's. y[m * ldy + n] (n in [n0, n1)) = the fixed tree over the parts'
  // dot products, ((p0 + p1) + (p2 + p3)) + ..., count a power of two:
  // bitwise what matmul() of each part, added in that tree, gives.
  void (*matmul_tree)(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                      float* y, int64_t ldy);
  // FP8 KV rows (kv/kv_layout.h: n E4M3 codes, then the row's float32
  // scale): out[i] = value(code i) x scale, rounded once to float32 — the
  // same bits on every table. dot_rows and weighted_sum compute on these
  // values (the AVX-512 table in registers, the others on widened copies).
  void (*widen_fp8_row)(const uint8_t* row, int64_t n, float* out);
  // One query's attention weights from its n scores, in place: the softmax
  // arithmetic below — the same bits on every table.
  void (*softmax)(float* s, int64_t n, float scale);
  // Rows a row-parallel product gives matmul_tree at a time (CpuModel::row_parallel): few, where a table adds
  // the parts' partials in memory; more where the table rearranges the weights per call (AMX), which the rows
  // then share.
  int64_t tree_rows = 64;
  // Attention in kBf16Amx's arithmetic (below), on kBf16Amx's tables; nullptr on every other (attention is then
  // dot_rows, softmax and weighted_sum: kF32's).
  void (*attend)(const AttendTask& task) = nullptr;
};

// The softmax of attention, one fixed arithmetic (every table, every batch):
//   x_j = s_j x scale; max = the largest x_j; e_j = exp_fixed(x_j - max);
//   sum: 16 lanes, lane i adding e_j for j = i, i + 16, ... in increasing j
//   (from 0), folded as l_i + l_{i+8}, then + the lane 4 on, 2 on, 1 on (the
//   halving tree); s_j = e_j / sum. Every operation rounds once to float32.
// exp_fixed(d) for d <= 0 (a NaN stays NaN): d' = max(d, -104) (below, every
// result is 0 or the smallest subnormals); n = nearest-even integer of
// d' x log2(e); r = fma(-n, ln2_lo, fma(-n, ln2_hi, d')) with Cephes' split
// ln2_hi = 0.693359375, ln2_lo = -2.12194440e-4; p = Horner with FMAs over
// Cephes' expf coefficients; y = fma(p, r x r, r) + 1; exp = y x 2^n rounded
// once (subnormal results included). Within 2 ulp of exp over [-87, 0].
float exp_fixed(float d);
void softmax_scalar(float* s, int64_t n, float scale);  // the reference, and the scalar table's
void softmax_avx512(float* s, int64_t n, float scale);  // the AVX-512 tables' (needs AVX-512F)

// The SwiGLU of the MLPs and the experts, one fixed arithmetic (every table, every ISA): g[i] becomes (x x s) x
// u[i] for x = g[i], where e = exp_fixed(-|x|) and s = 1 / (1 + e) for x >= 0, e / (1 + e) below, each operation
// rounding once to float32; a NaN result is the default quiet NaN (0x7fc00000), whichever NaN made it. (It took
// glibc's expf before, whose code the library picks by CPU, one element at a time.)
void swiglu(float* g, const float* u, int64_t n);  // the widest below this CPU runs, no wider than kernels()'s ISA
void swiglu_scalar(float* g, const float* u, int64_t n);  // the reference
void swiglu_avx2(float* g, const float* u, int64_t n);    // needs avx2_kernels()
void swiglu_avx512(float* g, const float* u, int64_t n);  // needs avx512_kernels()

// An FP8 KV row of n values from x (one token, one head): scale = max|x| /
// 448 (float32 division; 0 for a row of zeros, NaN for a row with a NaN or
// an infinity, which then widens to NaN), code i = E4M3 nearest x[i] / scale
// (ties to even, saturating). Depends on the row alone: chunking, batching
// and tensor-parallel widths give the same bytes.
void quantize_fp8_row(const float* x, int64_t n, uint8_t* row);
void quantize_fp8_row_scalar(const float* x, int64_t n, uint8_t* row);  // the same bytes, on any CPU
void quantize_fp8_row_avx512(const float* x, int64_t n, uint8_t* row);  // the same bytes; needs avx512_kernels()
// widen_fp8_row for the scalar and AVX2 tables: a table lookup and a multiply.
void widen_fp8_row_scalar(const uint8_t* row, int64_t n, float* out);

// dot_rows and weighted_sum on FP8 KV rows through `table`'s float32 ones,
// the rows widened (widen_fp8_row) a block at a time: the scalar and AVX2
// tables' FP8 path, and the AVX-512 table's where its own does not apply.
void dot_rows_widened(const KernelTable& table, const float* q, int64_t ldq, int64_t M, const void* const* rows,
                      int64_t count, int64_t n, float* out, int64_t ldo);
void weighted_sum_widened(const KernelTable& table, const float* w, int64_t ldw, int64_t M, const void* const* rows,
                          int64_t count, int64_t n, bool accumulate, float* out, int64_t ldo);

// matmul_tree as each part's matmul through `table`, the partials added in the
// tree: every table's reference, and the AVX-512 table's path where its fused
// kernel does not apply.
void matmul_tree_by_parts(const KernelTable& table, const float* x, int64_t ldx, int64_t M, const Matrix* parts,
                          int count, int64_t n0, int64_t n1, float* y, int64_t ldy);

// 8-bit matrices (weights.h: codes and their scales): every table computes
// the product on the matrix's values, code x scale rounded once to f32, with
// the f32 arithmetic above: bitwise what the f32 matrix of those values gives.
// Rows [a, b) of W's values, row-major, into out ([b - a][W.cols]).
void dequantize_rows(const Matrix& W, int64_t a, int64_t b, float* out);
// The product with an 8-bit W through `table`'s f32 matmul, a few rows of W
// dequantized at a time: the reference path (scalar, AVX2, edges).
void matmul_dequantized(const KernelTable& table, const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0,
                        int64_t n1, float* y, int64_t ldy);

// The arithmetic of the matrix products.
//   kF32: the dot products above (FP32 FMAs on exactly widened weights): the
//     same bits on every table, every ISA. The default.
//   kBf16Dot: products with bf16 weights in panels (the linear layers and the
//     LM head of a bf16 checkpoint) take x rounded to bf16 (nearest even) and
//     keep 4 lanes per output: lane j adds, 8 columns of K at a time (k-group
//     g), fma(x[8g+2j+1], w[8g+2j+1]) then fma(x[8g+2j], w[8g+2j]) (exact
//     products, subnormals flushed: AVX512-BF16's vdpbf16ps), folded as
//     (l0 + l2) + (l1 + l3). Twice the multiply-adds an instruction on CPUs
//     that have it, and other bits than kF32 (llama.cpp's bf16 arithmetic);
//     every other product, attention and the rest are kF32's. 8-bit weights
//     in panels (column blocks on multiples of 8) count as bf16 weights whose
//     values are code x scale (f32) rounded to bf16 (nearest even, a
//     subnormal to 0): the same arithmetic on those values, their row-
//     parallel tree each part's product added in the tree. The row-parallel
//     tree and batch invariance hold as in kF32, so outputs stay the same bits
//     across batches, splits and widths. Needs AVX512-BF16.
//   kInt8Dot: products with INT8 weights (an int8-channel or -tensor
//     checkpoint, or model.dtype = "int8") quantize their input as the
//     checkpoint's W8A8 recipe does, dynamically per token: each row of x
//     (in a row-parallel product, each of its kReduceChunks column chunks:
//     row_parallel.h) gets amax = max |x|, codes q = nearest-even(x x (127 /
//     amax)) and scale amax / 127 (quantize_int8_row); y = float(acc) x
//     (x's scale x w's row scale), acc the exact integer sum of q x code
//     (AVX512-VNNI's vpdpbusd), each float operation rounding once. An integer
//     sum has no order, so outputs are batch-invariant, and the row-parallel
//     tree keeps them the same bits at every width. Every other product
//     (bf16 weights, FP8, the LM head) and everything else is kF32's. Needs
//     AVX512-VNNI; products of at most kInt8DotMaxCols columns. Where the CPU
//     has AMX-INT8 (and Linux grants it), products of 16 rows or more run on
//     its tiles: exact integer sums too, so the same bits.
//   kBf16Amx: the products kBf16Dot takes (bf16 weights in panels, 8-bit
//     weights in panels as bf16 values), x rounded to bf16 the same way, in
//     the arithmetic of AMX's tdpbf16ps (measured on Sapphire Rapids, held
//     to it by the tests): K in blocks of 32 (the last padded with zero
//     products); in a block, E adds the products of its even k in increasing
//     k, O those of its odd k, each from +0, each step an FMA of the exact
//     product (bf16 subnormals read as 0, subnormal results flushed to signed
//     zero); the output t, from +0, becomes t + (E + O) block by block, those
//     adds flushing likewise. Where the CPU has AMX-BF16 (and Linux grants
//     it), products run on its tiles, whose peak is many times the FMA
//     units'; elsewhere on AVX-512 FMAs in the same order (AVX512-BF16 and
//     VBMI): the same bits on every such CPU. Batch invariance and the
//     row-parallel tree hold as in kBf16Dot.
//     Attention is on the tiles too (KernelTable::attend): a query's score
//     for position p is that product of bf16(q) and bf16(key p) (FP8 keys:
//     their values, as widen_fp8_row gives them, rounded to bf16) over
//     head_dim; the softmax is the one below on [first, pos]; the output is
//     the product of the weights rounded to bf16 (0 outside [first, pos])
//     and the values rounded likewise, its K the positions in blocks of 32
//     from a multiple of 32 (a block of zero weights adds nothing). Each
//     element depends on its query and the rows alone: the same bits in
//     prefill and decode, any chunking or batch. (Zero weights, a block or
//     inside one, skipped or added differ only where an output flushed to
//     -0: +0. A value row with an infinity or a NaN counts only for the
//     queries that see it, as in decode: 0 x inf is not taken.)
enum class MatmulMode { kF32, kBf16Dot, kInt8Dot, kBf16Amx };

// Whether CPUID.(7, 0):EDX has AMX-TILE and bit `feature` (22 AMX-BF16, 25
// AMX-INT8), and Linux grants this process the tile data (arch_prctl).
bool amx_usable(unsigned feature);
// kBf16Amx's product, one output at a time in plain C++ (any layout, bf16 or
// 8-bit weights): the reference.
void matmul_bf16amx_reference(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1,
                              float* y, int64_t ldy);

// kInt8Dot's products keep their integer sums in 32 bits: |sum of (q + 128)
// x code| < 255 x 128 x K must stay under 2^31.
constexpr int64_t kInt8DotMaxCols = 65536;

// kInt8Dot's activation codes of a row of n floats (the rule above): returns
// the scale; a row of zeros has codes 0 and scale 0, a row with a NaN or an
// infinity codes 0 and a NaN scale (its products are NaN).
float quantize_int8_row(const float* x, int64_t n, int8_t* q);
// Row n's scale of an INT8 matrix whose scales are one per row over its
// columns (a channel or a tensor: what kInt8Dot multiplies).
float int8_row_scale(const Matrix& W, int64_t n);
// kInt8Dot's product, one output at a time in plain C++ (any layout): the
// reference, and the VNNI table's path where its tiles do not apply.
void matmul_int8dot_reference(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1,
                              float* y, int64_t ldy);

// Chooses what kernels() returns, once per process, before the first model
// (TANDEM_CPU_KERNELS, below, wins); throws tandem::Error with one line when
// the CPU lacks what the mode needs.
void use_kernels(MatmulMode mode);

const KernelTable& kernels();         // the table chosen (by default the best kF32 table this CPU runs)
const KernelTable& scalar_kernels();  // the portable reference
const KernelTable* avx2_kernels();    // nullptr when not built or not supported here
const KernelTable* avx512_kernels();  // AVX-512 matrix tiles over the AVX2 table; nullptr when unsupported
const KernelTable* avx512_gfni_kernels();  // avx512 with its FP8 decode tiles on GFNI (same bits); nullptr without
const KernelTable* avx512_bf16_kernels();  // kBf16Dot on AVX512-BF16; nullptr when unsupported
const KernelTable* avx512_vnni_kernels();  // kInt8Dot on AVX512-VNNI; nullptr when unsupported
const KernelTable* avx512_amx_kernels();   // kInt8Dot on AMX-INT8 tiles from 16 rows (the same bits); nullptr without
const KernelTable* avx512_bf16amx_kernels();  // kBf16Amx on AVX-512 FMAs, every row count; nullptr without AVX-512
const KernelTable* amx_bf16_kernels();  // kBf16Amx on AMX-BF16 tiles from 16 rows (the same bits); nullptr without

}  // namespace tandem::runtime::cpu
