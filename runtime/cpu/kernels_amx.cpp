// The INT8 dot-product table on AMX (kernels.h, MatmulMode::kInt8Dot): Intel
// Xeons since Sapphire Rapids multiply 16 x 64 bytes of activations by 64 x
// 16 of weights into a 16 x 16 tile of 32-bit sums in one instruction
// (tdpbusd). The sums are exact integers, so the results are the VNNI
// table's bits: only the speed differs. This file alone is compiled with
// -mamx-tile -mamx-int8; it runs only where CPUID says AMX-INT8 and Linux
// grants the process the tile state (arch_prctl). Products of fewer than
// kAmxRows rows, and everything but INT8 panels, are the VNNI table's.
//
// Per call: x's rows quantized (int8_rows.h), padded to whole tiles of 16
// rows; then for each pair of weight panels (16 columns) their codes
// rearranged once into the B tiles' layout (four consecutive k of a column
// side by side, a row of the tile per four k) and multiplied by every pair
// of row tiles, 64 k at a time, two such column blocks at once (2 x 2 C tiles).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "runtime/cpu/amx_tiles.h"
#include "runtime/cpu/int8_rows.h"
#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int64_t kAmxRows = 16;  // fewer rows: the VNNI tiles (decode)

// Two panels' codes (the second may be absent: zeros) in the B tiles'
// layout: for each k-group of 8, row 2g holds k 8g..8g+3 of the 16 columns
// (4 bytes each), row 2g + 1 k 8g+4..8g+7; a tile is 16 rows (64 k). Also
// 128 x each column's code sum (the unsigned operand's offset, int8_rows.h).
__m512i pack_b(const int8_t* panel, bool two, int64_t K, int64_t Kp, uint8_t* out) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
  for (int64_t k = 0; k < K; k += 8) {
    const __m512i a = _mm512_loadu_si512(panel + 8 * k);
    const __m512i b = two ? _mm512_loadu_si512(panel + 8 * K + 8 * k) : _mm512_setzero_si512();
    s0 = dpbusd(s0, ones, a);
    s1 = dpbusd(s1, ones, b);
    _mm512_storeu_si512(out + 16 * k, _mm512_permutex2var_epi32(a, even, b));
    _mm512_storeu_si512(out + 16 * k + 64, _mm512_permutex2var_epi32(a, odd, b));
  }
  std::memset(out + 16 * K, 0, static_cast<std::size_t>(16 * (Kp - K)));  // k past K: codes 0
  return _mm512_slli_epi32(fold_pairs(s0, s1), 7);
}

// 16 rows' sums (a C tile, stored) into y: minus the offset, times the scales, columns [c0, c1).
inline void finish_rows(const int32_t* c, int64_t rows, const float* xs, __m512i sums, const float* ws, float* y,
                        int64_t ldy, int c0, int c1) {
  const __m512 w = _mm512_loadu_ps(ws);
  const __mmask16 mask = static_cast<__mmask16>(((1u << c1) - 1u) & ~((1u << c0) - 1u));
  for (int64_t m = 0; m < rows; ++m) {
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(_mm512_loadu_si512(c + 16 * m), sums));
    _mm512_mask_storeu_ps(y + m * ldy, mask, _mm512_mul_ps(sum, _mm512_mul_ps(_mm512_set1_ps(xs[m]), w)));
  }
}

// One column block of a pair: its packed B (16 columns), code sums, row scales and the columns it stores.
struct ColumnBlock {
  const uint8_t* b;
  __m512i sums;
  alignas(64) float ws[16];
  int c0, c1;  // columns [c0, c1) of the 16 stored (c0 == c1: none)
};

// Rows [32 t, 32 t + 32) of q against two column blocks: C tiles 0-3 (2 x 2 of 16 x 16), A in 4-5, B in 6-7;
// every tile loaded is used twice (tiles are not renamed: one A tile reused would serialize the products).
void tile_pair(const Int8Rows& q, int64_t t, int64_t M, const ColumnBlock (&cb)[2], int64_t Kp, float* y,
               int64_t ldy) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  const uint8_t* a = q.codes.data() + t * 32 * q.ld;
  const int64_t stride = q.ld, half = 16 * q.ld;
  for (int64_t k = 0; k < Kp; k += 64) {
    _tile_loadd(4, a + k, stride);
    _tile_loadd(6, cb[0].b + 16 * k, 64);
    _tile_loadd(5, a + half + k, stride);
    _tile_loadd(7, cb[1].b + 16 * k, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_dpbusd(1, 4, 7);
    _tile_dpbusd(2, 5, 6);
    _tile_dpbusd(3, 5, 7);
  }
  alignas(64) int32_t c[4][16 * 16];
  _tile_stored(0, c[0], 64);
  _tile_stored(1, c[1], 64);
  _tile_stored(2, c[2], 64);
  _tile_stored(3, c[3], 64);
  for (int i = 0; i < 2; ++i) {  // rows 32 t + 16 i on
    const int64_t m0 = t * 32 + 16 * i;
    if (m0 >= M) break;
    const int64_t rows = std::min<int64_t>(16, M - m0);
    for (int j = 0; j < 2; ++j)
      if (cb[j].c0 < cb[j].c1)
        finish_rows(c[2 * i + j], rows, q.scale.data() + m0, cb[j].sums, cb[j].ws, y + m0 * ldy + 16 * j, ldy,
                    cb[j].c0, cb[j].c1);
  }
}

void matmul_amx(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                int64_t ldy) {
  if (W.dtype != DType::kI8 || !W.panels || M < kAmxRows)
    return avx512_vnni_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);
  const int64_t K = W.cols;
  thread_local Int8Rows q;
  thread_local LineVector<uint8_t> packed;
  q.quantize(x, ldx, M, K, 32);
  const int64_t Kp = q.ld, pairs = (M + 31) / 32;
  packed.resize(static_cast<std::size_t>(32 * Kp));
  const auto* codes = static_cast<const int8_t*>(W.data);
  configure_tiles();
  for (int64_t p = n0 / 8 * 8; p < n1; p += 32) {
    ColumnBlock cb[2];
    for (int j = 0; j < 2; ++j) {
      const int64_t first = p + 16 * j;  // its first column
      uint8_t* b = packed.data() + j * 16 * Kp;
      cb[j].b = b;
      std::fill(cb[j].ws, cb[j].ws + 16, 0.0f);
      if (first >= n1) {  // past the range: zeros, nothing stored
        std::memset(b, 0, static_cast<std::size_t>(16 * Kp));
        cb[j].sums = _mm512_setzero_si512();
        cb[j].c0 = cb[j].c1 = 0;
        continue;
      }
      const bool two = first + 8 < n1;
      cb[j].c0 = static_cast<int>(std::max<int64_t>(n0, first) - first);
      cb[j].c1 = static_cast<int>(std::min<int64_t>(n1, first + 16) - first);
      for (int i = 0; i < (two ? 16 : 8) && first + i < W.rows; ++i) cb[j].ws[i] = int8_row_scale(W, first + i);
      cb[j].sums = pack_b(codes + first * K, two, K, Kp, b);
    }
    for (int64_t t = 0; t < pairs; ++t) tile_pair(q, t, M, cb, Kp, y + p, ldy);
  }
  _tile_release();
  // GCC 12 puts no vzeroupper here: the callers' SSE code then ran 2-3x slower (measured: a 512-token prefill
  // 9.8 s instead of 4.4)
  _mm256_zeroupper();
}

void matmul_tree_amx(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                     float* y, int64_t ldy) {
  if (parts[0].dtype == DType::kI8)
    return matmul_tree_by_parts(*avx512_amx_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
  return avx512_vnni_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);
}

}  // namespace

const KernelTable* avx512_amx_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_vnni_kernels();
    if (!base || !amx_usable(25)) return nullptr;  // AMX-INT8
    static const KernelTable t{"amx-int8", matmul_amx, base->dot, base->axpy, base->dot_rows,
                               base->weighted_sum, matmul_tree_amx, base->widen_fp8_row, base->softmax};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
