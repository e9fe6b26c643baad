// AVX-512 matrix kernel (this file alone is compiled with AVX-512 flags; it
// runs only after the CPU says it has them).
//
// Same arithmetic as the AVX2 and scalar tables, bit for bit: a zmm register
// holds the 8-lane accumulators of two output columns side by side (lanes
// 0-7: column n, lanes 8-15: column n+1), and x's 8 values are repeated in
// both halves. Every lane thus does exactly the FMA chain of kernels.h; the
// wider registers only do two columns per instruction. Small batches (fewer
// than 4 rows, memory-bound) and the other operations use the AVX2 code.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

// Columns n and n + 1 of W at k, 8 each, as one zmm.
template <DType D>
inline __m512 load_pair(const uint8_t* row_n, const uint8_t* row_n1, int64_t k) {
  if constexpr (D == DType::kF32) {
    const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(row_n) + k);
    const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(row_n1) + k);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  } else {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row_n) + k));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row_n1) + k));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    if constexpr (D == DType::kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(both), 16));
    else return _mm512_cvtph_ps(both);
  }
}

// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) of one 8-lane half.
inline float fold(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_shuffle_ps(a, a, 1)));
}

// MR rows of x against NP pairs of W rows (2 * NP output columns).
template <DType D, int MR, int NP>
inline void tile(const float* x, int64_t ldx, const uint8_t* w, int64_t row_bytes, int64_t K, float* y, int64_t ldy) {
  __m512 acc[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_setzero_ps();
  const int64_t K8 = K & ~int64_t{7};
  for (int64_t k = 0; k < K8; k += 8) {
    __m512 wv[NP];
    for (int p = 0; p < NP; ++p) wv[p] = load_pair<D>(w + (2 * p) * row_bytes, w + (2 * p + 1) * row_bytes, k);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + m * ldx + k));
      for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_fmadd_ps(xv, wv[p], acc[m][p]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int p = 0; p < NP; ++p) {
      for (int half = 0; half < 2; ++half) {
        const __m256 v = half ? _mm512_extractf32x8_ps(acc[m][p], 1) : _mm512_castps512_ps256(acc[m][p]);
        float r = fold(v);
        const uint8_t* row = w + (2 * p + half) * row_bytes;
        for (int64_t k = K8; k < K; ++k) r = std::fma(x[m * ldx + k], load_as_f32(row, D, static_cast<std::size_t>(k)), r);
        y[m * ldy + 2 * p + half] = r;
      }
    }
  }
}

template <DType D>
void matmul_t(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
              int64_t ldy) {
  const int64_t K = W.cols;
  const int64_t row_bytes = K * static_cast<int64_t>(dtype_size(D));
  const auto* wbase = static_cast<const uint8_t*>(W.data);
  // Columns in whole tiles of 6 here; the rest (and small batches) on AVX2.
  const int64_t n6 = n0 + (n1 - n0) / 6 * 6;
  const int64_t m_block = std::max<int64_t>(4, (int64_t{1} << 20) / (K * 4) / 4 * 4);
  const int64_t n_block = std::max<int64_t>(6, (int64_t{256} << 10) / row_bytes / 6 * 6);
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    for (int64_t nb = n0; nb < n6; nb += n_block) {
      const int64_t ne = std::min(n6, nb + n_block);
      int64_t m = mb;
      for (; m + 4 <= me; m += 4)
        for (int64_t n = nb; n < ne; n += 6) tile<D, 4, 3>(x + m * ldx, ldx, wbase + n * row_bytes, row_bytes, K, y + m * ldy + n, ldy);
      for (; m < me; ++m)
        for (int64_t n = nb; n < ne; n += 6) tile<D, 1, 3>(x + m * ldx, ldx, wbase + n * row_bytes, row_bytes, K, y + m * ldy + n, ldy);
    }
  }
  if (n6 < n1) avx2_kernels()->matmul(x, ldx, M, W, n6, n1, y, ldy);
}

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (M < 4) return avx2_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);
  switch (W.dtype) {
    case DType::kF32: return matmul_t<DType::kF32>(x, ldx, M, W, n0, n1, y, ldy);
    case DType::kBF16: return matmul_t<DType::kBF16>(x, ldx, M, W, n0, n1, y, ldy);
    case DType::kF16: return matmul_t<DType::kF16>(x, ldx, M, W, n0, n1, y, ldy);
  }
}

}  // namespace

const KernelTable* avx512_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx2_kernels();
    if (!base || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
      return nullptr;
    static const KernelTable t{"avx512", matmul, base->dot, base->axpy, base->dot_rows, base->weighted_sum};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
