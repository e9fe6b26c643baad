// The INT8 dot-product table (kernels.h, MatmulMode::kInt8Dot): INT8 weights
// in panels against activations quantized per row, AVX512-VNNI's vpdpbusd
// adding four byte products into each 32-bit lane, 64 a zmm. This file alone
// is compiled with -mavx512vnni; it runs only after the CPU says it has it.
// Every product but those with INT8 weights is the best FP32 table's.
//
// vpdpbusd multiplies unsigned bytes by signed ones, so a row's codes q go in
// as q + 128 and each output's sum loses 128 x (the sum of its weights'
// codes), which the tile adds up beside (vpdpbusd with bytes of 1) once per
// panel. Both sums are exact in 32 bits (kInt8DotMaxCols), so the result is
// exactly matmul_int8dot_reference's, whatever the tile or thread.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/int8_rows.h"
#include "runtime/cpu/quantized_panel.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int kRows = 8;  // rows of x a tile: 16 accumulators, 2 of weights, 2 of sums

// MR rows of quantized x against P (1 or 2) INT8 panels at `panel` (the
// second 8 K bytes on): y[m][c0, c1) of the 8 P columns. With kSums the
// weights' code sums are made too, into *sums (folded, times 128); without,
// *sums is read.
template <int MR, int P, bool kSums>
inline void int8_tile(const uint8_t* xq, int64_t ldq, const float* xs, const int8_t* panel, int64_t K,
                      const float* ws, __m512i* sums, float* y, int64_t ldy, int c0, int c1) {
  __m512i acc[MR][P], wsum[P];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < P; ++p) acc[m][p] = _mm512_setzero_si512();
  for (int p = 0; p < P; ++p) wsum[p] = _mm512_setzero_si512();
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t k = 0; k < K; k += 8) {
    __m512i wv[P];
    for (int p = 0; p < P; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(panel + p * 8 * K + 8 * k) + 1024, _MM_HINT_T0);
      wv[p] = _mm512_loadu_si512(panel + p * 8 * K + 8 * k);
      if constexpr (kSums) wsum[p] = dpbusd(wsum[p], ones, wv[p]);
    }
    for (int m = 0; m < MR; ++m) {
      int64_t bytes;
      std::memcpy(&bytes, xq + m * ldq + k, 8);
      const __m512i xv = _mm512_set1_epi64(bytes);
      for (int p = 0; p < P; ++p) acc[m][p] = dpbusd(acc[m][p], xv, wv[p]);
    }
  }
  if constexpr (kSums) *sums = _mm512_slli_epi32(fold_pairs(wsum[0], P == 2 ? wsum[P - 1] : _mm512_setzero_si512()), 7);
  const __m512 w = _mm512_loadu_ps(ws);
  const __mmask16 mask = static_cast<__mmask16>(((1u << c1) - 1u) & ~((1u << c0) - 1u));
  for (int m = 0; m < MR; ++m) {
    const __m512i s = fold_pairs(acc[m][0], P == 2 ? acc[m][P - 1] : _mm512_setzero_si512());
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_sub_epi32(s, *sums));
    _mm512_mask_storeu_ps(y + m * ldy, mask, _mm512_mul_ps(sum, _mm512_mul_ps(_mm512_set1_ps(xs[m]), w)));
  }
}

template <int MR, int P, bool kSums>
inline void int8_tile_rows(int64_t mr, const uint8_t* xq, int64_t ldq, const float* xs, const int8_t* panel,
                           int64_t K, const float* ws, __m512i* sums, float* y, int64_t ldy, int c0, int c1) {
  if constexpr (MR == 1) {
    int8_tile<1, P, kSums>(xq, ldq, xs, panel, K, ws, sums, y, ldy, c0, c1);
  } else {
    if (mr == MR) int8_tile<MR, P, kSums>(xq, ldq, xs, panel, K, ws, sums, y, ldy, c0, c1);
    else int8_tile_rows<MR - 1, P, kSums>(mr, xq, ldq, xs, panel, K, ws, sums, y, ldy, c0, c1);
  }
}

template <int P>
inline void int8_tiles(int64_t M, const Int8Rows& q, const int8_t* panel, int64_t K, const float* ws, float* y,
                       int64_t ldy, int c0, int c1) {
  __m512i sums;
  bool first = true;
  for (int64_t m = 0, left = (M + kRows - 1) / kRows; left > 0; --left) {
    const int64_t mr = (M - m + left - 1) / left;
    const uint8_t* xq = q.codes.data() + m * q.ld;
    const float* xs = q.scale.data() + m;
    if (first) int8_tile_rows<kRows, P, true>(mr, xq, q.ld, xs, panel, K, ws, &sums, y + m * ldy, ldy, c0, c1);
    else int8_tile_rows<kRows, P, false>(mr, xq, q.ld, xs, panel, K, ws, &sums, y + m * ldy, ldy, c0, c1);
    first = false;
    m += mr;
  }
}

void matmul_int8dot(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                    int64_t ldy) {
  if (W.dtype != DType::kI8) return avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);  // FP32's contract
  if (!W.panels) return matmul_int8dot_reference(x, ldx, M, W, n0, n1, y, ldy);
  const int64_t K = W.cols;
  thread_local Int8Rows q;
  const int64_t m_block = std::max<int64_t>(kRows, (int64_t{1} << 18) / K);  // ~256 KiB of codes
  const auto* codes = static_cast<const int8_t*>(W.data);
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    q.quantize(x + mb * ldx, ldx, me - mb, K);
    for (int64_t p = n0 / 8 * 8; p < n1;) {
      const int two = p + 8 < n1 ? 2 : 1;
      const int c0 = static_cast<int>(std::max<int64_t>(n0, p) - p);
      const int c1 = static_cast<int>(std::min<int64_t>(n1, p + 8 * two) - p);
      alignas(64) float ws[16] = {};
      for (int j = 0; j < 8 * two && p + j < W.rows; ++j) ws[j] = int8_row_scale(W, p + j);
      if (two == 2) int8_tiles<2>(me - mb, q, codes + p * K, K, ws, y + mb * ldy + p, ldy, c0, c1);
      else int8_tiles<1>(me - mb, q, codes + p * K, K, ws, y + mb * ldy + p, ldy, c0, c1);
      p += 8 * two;
    }
  }
}

// The row-parallel product: each chunk quantized and multiplied on its own
// (kernels.h), the chunks' results added in the tree.
void matmul_tree_int8dot(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0,
                         int64_t n1, float* y, int64_t ldy) {
  if (parts[0].dtype == DType::kI8)
    return matmul_tree_by_parts(*avx512_vnni_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
  return avx512_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);
}

}  // namespace

const KernelTable* avx512_vnni_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_kernels();
    if (!base || !__builtin_cpu_supports("avx512vnni")) return nullptr;
    static const KernelTable t{"avx512-vnni", matmul_int8dot, base->dot, base->axpy, base->dot_rows,
                               base->weighted_sum, matmul_tree_int8dot, base->widen_fp8_row, base->softmax};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
