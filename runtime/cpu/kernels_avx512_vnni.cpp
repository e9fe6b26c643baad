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
#include "runtime/cpu/quantized_panel.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int kRows = 8;  // rows of x a tile: 16 accumulators, 2 of weights, 2 of sums

// A block of x's rows as quantize_int8_row makes them, the codes stored as
// q + 128 (unsigned), K padded to a multiple of 8 with q = 0.
struct Int8Rows {
  std::vector<uint8_t> codes;
  std::vector<float> scale;
  int64_t ld = 0;

  void quantize(const float* x, int64_t ldx, int64_t M, int64_t K) {
    ld = (K + 7) / 8 * 8;
    codes.resize(static_cast<std::size_t>(M * ld));
    scale.resize(static_cast<std::size_t>(M));
    for (int64_t m = 0; m < M; ++m) scale[static_cast<std::size_t>(m)] = row(x + m * ldx, K, codes.data() + m * ld);
  }

  // quantize_int8_row's codes and scale, 16 at a time.
  float row(const float* x, int64_t K, uint8_t* out) const {
    __m512 amax = _mm512_setzero_ps();
    __mmask16 bad = 0;
    const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7FFFFFFF));
    const __m512 inf = _mm512_set1_ps(INFINITY);
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 in = K - k >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (K - k)) - 1u);
      const __m512 a = _mm512_and_ps(_mm512_maskz_loadu_ps(in, x + k), abs_mask);
      bad |= _mm512_cmp_ps_mask(a, inf, _CMP_NLT_UQ);  // NaN or infinity
      amax = _mm512_max_ps(amax, a);
    }
    const float top = _mm512_reduce_max_ps(amax);
    const int64_t padded = (K + 7) / 8 * 8;
    if (bad || top == 0.0f) {
      std::memset(out, 128, static_cast<std::size_t>(padded));
      return bad ? NAN : 0.0f;
    }
    const __m512 inv = _mm512_set1_ps(127.0f / top);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (int64_t k = 0; k < padded; k += 16) {
      const __mmask16 in = K - k >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (K - k)) - 1u);
      const __mmask16 pad = padded - k >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << (padded - k)) - 1u);
      __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(in, x + k), inv);
      v = _mm512_min_ps(_mm512_max_ps(_mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), lo), hi);
      const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(v), _mm512_set1_epi32(128));
      _mm_mask_storeu_epi8(out + k, pad, _mm512_cvtepi32_epi8(q));
    }
    return top / 127.0f;
  }
};

// acc + the four byte products of each lane (a unsigned, b signed): vpdpbusd in
// place. GCC 12 copies the accumulator of _mm512_dpbusd_epi32 to another register
// each call, a move per product in the tile's loop.
inline __m512i dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// A panel's lanes hold (row r, half h) at dword 2r + h: the 16 outputs of
// two panels (the second's lanes may be zero) as row sums, in column order.
inline __m512i fold_pairs(__m512i a, __m512i b) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  return _mm512_add_epi32(_mm512_permutex2var_epi32(a, even, b), _mm512_permutex2var_epi32(a, odd, b));
}

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
