// The AVX-512 tables' building blocks (kernels_avx512.cpp's matrix
// products, kernels_avx512_attention.cpp's attention): a zmm holds the
// 8-lane accumulators of two output columns side by side (lanes 0-7: column
// n, lanes 8-15: column n + 1), x's 8 values repeated in both halves, so
// every lane does exactly the FMA chain of kernels.h. Included only by files
// compiled with AVX-512 flags, and in an unnamed namespace: each includer has
// its own copy.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {

// The AVX-512 table's attention (kernels_avx512_attention.cpp): its
// dot_rows, weighted_sum and widen_fp8_row entries.
void avx512_dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count,
                     int64_t n, float* out, int64_t ldo);
void avx512_weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count,
                         int64_t n, bool accumulate, float* out, int64_t ldo);
void avx512_widen_fp8_row(const uint8_t* row, int64_t n, float* out);

namespace {

// Columns n and n + 1 of W at k, 8 each, as one zmm: from two row starts, or
// (Contig) from one, where column n + 1's eight weights follow column n's, as
// in a panel.
template <DType D, bool Contig>
inline __m512 load_pair(const uint8_t* row_n, const uint8_t* row_n1, int64_t k) {
  if constexpr (D == DType::kF32) {
    if constexpr (Contig) return _mm512_loadu_ps(reinterpret_cast<const float*>(row_n) + k);
    const __m256 lo = _mm256_loadu_ps(reinterpret_cast<const float*>(row_n) + k);
    const __m256 hi = _mm256_loadu_ps(reinterpret_cast<const float*>(row_n1) + k);
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
  } else {
    __m256i both;
    if constexpr (Contig) {
      both = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row_n) + k));
    } else {
      const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row_n) + k));
      const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(reinterpret_cast<const uint16_t*>(row_n1) + k));
      both = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    }
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

// Sixteen dot products folded at once: a[j] holds the 8-lane accumulators of
// two columns (lanes 0-7 and 8-15); lanes 2j and 2j + 1 of the result are
// their folds, each ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)) with exactly the
// additions fold() makes (addition commutes, so which operand is on the left
// does not change a bit). Three levels of adds over shuffled registers, about
// two instructions an output where fold() takes seven.
inline __m512 fold16(const __m512 (&a)[8]) {
  // Level 1, each 128-bit quarter: lanes i + (i + 4) of an 8-lane half; two registers packed into one,
  // quarters [a.col0, a.col1, b.col0, b.col1].
  __m512 u[4];
  for (int j = 0; j < 4; ++j) {
    const __m512 s0 = _mm512_add_ps(a[2 * j], _mm512_shuffle_f32x4(a[2 * j], a[2 * j], _MM_SHUFFLE(2, 3, 0, 1)));
    const __m512 s1 = _mm512_add_ps(a[2 * j + 1], _mm512_shuffle_f32x4(a[2 * j + 1], a[2 * j + 1], _MM_SHUFFLE(2, 3, 0, 1)));
    u[j] = _mm512_shuffle_f32x4(s0, s1, _MM_SHUFFLE(2, 0, 2, 0));
  }
  // Level 2: (a0 + a2) and (a1 + a3) of each quarter; two registers packed, pairs side by side.
  __m512 w[2];
  for (int j = 0; j < 2; ++j) {
    const __m512 v0 = _mm512_add_ps(u[2 * j], _mm512_permute_ps(u[2 * j], _MM_SHUFFLE(1, 0, 3, 2)));
    const __m512 v1 = _mm512_add_ps(u[2 * j + 1], _mm512_permute_ps(u[2 * j + 1], _MM_SHUFFLE(1, 0, 3, 2)));
    w[j] = _mm512_shuffle_ps(v0, v1, _MM_SHUFFLE(1, 0, 1, 0));
  }
  // Level 3: b0 + b1 in lanes 0 and 2 of each quarter, then packed.
  const __m512 x0 = _mm512_add_ps(w[0], _mm512_permute_ps(w[0], _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 x1 = _mm512_add_ps(w[1], _mm512_permute_ps(w[1], _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 r = _mm512_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
  // r: quarter q, position i holds register 2i + (q >> 1), column q & 1; reordered to lanes 2j + h (register j, column h).
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, r);
}

// MR rows of x against one panel (8 columns, K % 8 == 0) of type D, the
// 8-lane accumulators folded sixteen at a time: out[g] = rows 2g and 2g + 1,
// 8 columns each (a missing last row's lanes are 0).
// load(k, wv) sets wv[p] to the panel's rows 2p and 2p + 1 at columns k..k+7, as float.
template <int MR, class Load>
inline void panel_folds_with(const float* x, int64_t ldx, int64_t K, Load&& load, __m512 (&out)[(MR + 1) / 2]) {
  __m512 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < 4; ++p) acc[m][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m512 wv[4];
    load(k, wv);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + m * ldx + k));
      for (int p = 0; p < 4; ++p) acc[m][p] = _mm512_fmadd_ps(xv, wv[p], acc[m][p]);
    }
  }
  for (int m = 0; m < MR; m += 2) {
    __m512 g[8];
    for (int p = 0; p < 4; ++p) {
      g[p] = acc[m][p];
      g[4 + p] = m + 1 < MR ? acc[std::min(m + 1, MR - 1)][p] : _mm512_setzero_ps();
    }
    out[m / 2] = fold16(g);
  }
}

template <DType D, int MR>
inline void panel_folds(const float* x, int64_t ldx, const uint8_t* panel, int64_t K, __m512 (&out)[(MR + 1) / 2]) {
  constexpr int64_t es = D == DType::kF32 ? 4 : 2;
  panel_folds_with<MR>(x, ldx, K, [&](int64_t k, __m512 (&wv)[4]) {
    if constexpr (D != DType::kF32) {  // a panel streaming from memory: one stream, fetched ahead
      for (int64_t b = 0; b < 8 * 8 * es; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(panel + (8 * k) * es + 1024 + b), _MM_HINT_T0);
    }
    for (int p = 0; p < 4; ++p) wv[p] = load_pair<D, true>(panel + 16 * p * es, nullptr, 8 * k);
  }, out);
}

// Rows 2g and 2g + 1 of a folded tile into y (8 columns; MR may be odd).
template <int MR>
inline void store_folds(const __m512 (&r)[(MR + 1) / 2], float* y, int64_t ldy) {
  for (int m = 0; m < MR; m += 2) {
    _mm256_storeu_ps(y + m * ldy, _mm512_castps512_ps256(r[m / 2]));
    if (m + 1 < MR) _mm256_storeu_ps(y + (m + 1) * ldy, _mm512_extractf32x8_ps(r[m / 2], 1));
  }
}

// MR rows of x against NP pairs of W rows (2 * NP output columns). Row j's
// weights for k..k+7 start at w[j] + KS * k elements (KS = 1 row-major, 8 in
// a panel); with Contig, w[0] alone locates all of them (a whole panel).
template <DType D, int MR, int NP, int KS, bool Contig>
inline void tile(const float* x, int64_t ldx, const uint8_t* const* w, int64_t K, float* y, int64_t ldy) {
  if constexpr (Contig && NP == 4 && KS == 8) {  // a whole panel, no tail: the folds sixteen at a time
    __m512 r[(MR + 1) / 2];
    panel_folds<D, MR>(x, ldx, w[0], K, r);
    store_folds<MR>(r, y, ldy);
    return;
  }
  constexpr int64_t es = D == DType::kF32 ? 4 : 2;
  __m512 acc[MR][NP];
  for (int m = 0; m < MR; ++m)
    for (int p = 0; p < NP; ++p) acc[m][p] = _mm512_setzero_ps();
  const int64_t K8 = K & ~int64_t{7};
  for (int64_t k = 0; k < K8; k += 8) {
    if constexpr (Contig && D != DType::kF32) {  // a panel streaming from memory: one stream, fetched ahead
      for (int64_t b = 0; b < 2 * NP * 8 * es; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w[0] + (KS * k) * es + 1024 + b), _MM_HINT_T0);
    }
    __m512 wv[NP];
    for (int p = 0; p < NP; ++p) {
      if constexpr (Contig) wv[p] = load_pair<D, true>(w[0] + 16 * p * es, nullptr, KS * k);
      else wv[p] = load_pair<D, false>(w[2 * p], w[2 * p + 1], KS * k);
    }
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
        if constexpr (KS == 1) {  // panels have no tail (cols % 8 == 0)
          const uint8_t* row = w[2 * p + half];
          for (int64_t k = K8; k < K; ++k) r = std::fma(x[m * ldx + k], load_as_f32(row, D, static_cast<std::size_t>(k)), r);
        }
        y[m * ldy + 2 * p + half] = r;
      }
    }
  }
}

// The tile for mr <= MR rows.
template <DType D, int MR, int NP, int KS, bool Contig>
inline void tile_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* const* w, int64_t K, float* y,
                      int64_t ldy) {
  if constexpr (MR == 1) {
    tile<D, 1, NP, KS, Contig>(x, ldx, w, K, y, ldy);
  } else {
    if (mr == MR) tile<D, MR, NP, KS, Contig>(x, ldx, w, K, y, ldy);
    else tile_rows<D, MR - 1, NP, KS, Contig>(mr, x, ldx, w, K, y, ldy);
  }
}

// Widens one panel (8 rows x K) to float, in the same panel order, so that
// every row tile of x reuses converted weights; the conversion is exact.
template <DType D>
const float* panel_as_f32(const uint8_t* panel, int64_t K, std::vector<float>& buf) {
  if constexpr (D == DType::kF32) {
    return reinterpret_cast<const float*>(panel);
  } else {
    buf.resize(static_cast<std::size_t>(8 * K));
    float* out = buf.data();
    for (int64_t i = 0; i < 8 * K; i += 16) {
      _mm512_storeu_ps(out + i, load_pair<D, true>(panel, nullptr, i));
    }
    return out;
  }
}

// Splits rows [m0, m1) into ceil(rows / MR) tiles of near-equal height (8
// rows: 4 + 4, not 6 + 2): tile(first row, height) for each.
template <int MR, class Tile>
inline void near_equal_tiles(int64_t m0, int64_t m1, const Tile& tile) {
  int64_t m = m0;
  for (int64_t left = (m1 - m0 + MR - 1) / MR; left > 0; --left) {
    const int64_t mr = (m1 - m + left - 1) / left;
    tile(m, mr);
    m += mr;
  }
}

template <DType D, int MR, int NP, int KS, bool Contig>
inline void row_tiles(int64_t m0, int64_t m1, const float* x, int64_t ldx, const uint8_t* const* w, int64_t K,
                      float* y, int64_t ldy) {
  near_equal_tiles<MR>(m0, m1, [&](int64_t m, int64_t mr) {
    tile_rows<D, MR, NP, KS, Contig>(mr, x + m * ldx, ldx, w, K, y + m * ldy, ldy);
  });
}

}  // namespace
}  // namespace tandem::runtime::cpu
