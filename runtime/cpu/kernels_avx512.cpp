// AVX-512 matrix kernel (this file alone is compiled with AVX-512 flags; it
// runs only after the CPU says it has them).
//
// Same arithmetic as the AVX2 and scalar tables, bit for bit: a zmm register
// holds the 8-lane accumulators of two output columns side by side (lanes
// 0-7: column n, lanes 8-15: column n+1), and x's 8 values are repeated in
// both halves. Every lane thus does exactly the FMA chain of kernels.h; the
// wider registers only do two columns per instruction. The attention kernels
// tile several queries against shared keys and values the same way. Small
// batches (fewer than 4 rows, memory-bound) and the vector operations use the
// AVX2 code.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
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

// MR rows of x against NP pairs of W rows (2 * NP output columns). Row j's
// weights for k..k+7 start at w[j] + KS * k elements (KS = 1 row-major, 8 in
// a panel); with Contig, w[0] alone locates all of them (a whole panel).
template <DType D, int MR, int NP, int KS, bool Contig>
inline void tile(const float* x, int64_t ldx, const uint8_t* const* w, int64_t K, float* y, int64_t ldy) {
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

// Splits rows into ceil(rows / MR) tiles of near-equal height (8 rows: 4 + 4,
// not 6 + 2), and runs each.
template <DType D, int MR, int NP, int KS, bool Contig>
inline void row_tiles(int64_t m0, int64_t m1, const float* x, int64_t ldx, const uint8_t* const* w, int64_t K,
                      float* y, int64_t ldy) {
  int64_t m = m0;
  for (int64_t left = (m1 - m0 + MR - 1) / MR; left > 0; --left) {
    const int64_t mr = (m1 - m + left - 1) / left;
    tile_rows<D, MR, NP, KS, Contig>(mr, x + m * ldx, ldx, w, K, y + m * ldy, ldy);
    m += mr;
  }
}

// Row-major weights: tiles of 4 x 6 columns, walked in cache blocks (a block
// of W stays in L2 while the rows of x pass it).
template <DType D>
void matmul_rows(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                 int64_t ldy) {
  const int64_t K = W.cols;
  const auto es = static_cast<int64_t>(dtype_size(D));
  const auto* wbase = static_cast<const uint8_t*>(W.data);
  const int64_t t1 = n0 + (n1 - n0) / 6 * 6;
  const int64_t m_block = std::max<int64_t>(4, (int64_t{1} << 20) / (K * 4) / 4 * 4);
  const int64_t n_block = std::max<int64_t>(6, (int64_t{256} << 10) / (K * es) / 6 * 6);
  const uint8_t* rows[6];
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    for (int64_t nb = n0; nb < t1; nb += n_block) {
      const int64_t ne = std::min(t1, nb + n_block);
      for (int64_t n = nb; n < ne; n += 6) {
        for (int j = 0; j < 6; ++j) rows[j] = wbase + (n + j) * K * es;
        row_tiles<D, 4, 3, 1, false>(mb, me, x, ldx, rows, K, y + n, ldy);
      }
    }
  }
  if (t1 < n1) avx2_kernels()->matmul(x, ldx, M, W, t1, n1, y, ldy);
}

// Panels: each whole panel is widened once per block of x rows, then every
// row tile (up to 6 x 8 columns) reads it as float. Partial panels at the
// edges of [n0, n1) go to the AVX2 table.
template <DType D>
void matmul_panels(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  const int64_t K = W.cols;
  const auto es = static_cast<int64_t>(dtype_size(D));
  const auto* wbase = static_cast<const uint8_t*>(W.data);
  const int64_t t0 = std::min(n1, (n0 + 7) / 8 * 8);
  const int64_t t1 = std::max(t0, n1 / 8 * 8);
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 19) / (K * 4));  // ~512 KiB of x
  thread_local std::vector<float> wide;
  constexpr int64_t kWiden = 16;  // fewer rows: converting in registers beats a widened copy
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    for (int64_t n = t0; n < t1; n += 8) {
      const uint8_t* panel = wbase + n * K * es;
      if (me - mb < kWiden) {
        row_tiles<D, 6, 4, 8, true>(mb, me, x, ldx, &panel, K, y + n, ldy);
      } else {
        panel = reinterpret_cast<const uint8_t*>(panel_as_f32<D>(panel, K, wide));
        row_tiles<DType::kF32, 6, 4, 8, true>(mb, me, x, ldx, &panel, K, y + n, ldy);
      }
    }
  }
  if (n0 < t0) avx2_kernels()->matmul(x, ldx, M, W, n0, t0, y, ldy);
  if (t1 < n1) avx2_kernels()->matmul(x, ldx, M, W, t1, n1, y, ldy);
}

// Attention scores: the queries are the rows of x, six keys make a tile
// (three pairs), exactly the matrix tile on row pointers.
template <DType D>
void dot_rows_d(const float* q, int64_t ldq, int64_t M, const void* const* rows, int64_t count, int64_t n, float* out,
                int64_t ldo) {
  const auto* w = reinterpret_cast<const uint8_t* const*>(rows);
  int64_t r = 0;
  for (; r + 6 <= count; r += 6) row_tiles<D, 6, 3, 1, false>(0, M, q, ldq, w + r, n, out + r, ldo);
  if (r < count) avx2_kernels()->dot_rows(q, ldq, M, D, rows + r, count - r, n, out + r, ldo);
}

void dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
              float* out, int64_t ldo) {
  with_dtype(kv, [&](auto d) { dot_rows_d<decltype(d)::value>(q, ldq, M, rows, count, n, out, ldo); });
}

// Sixteen elements from i on (those the mask keeps), widened to float.
template <DType D>
inline __m512 load16(__mmask16 mask, const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm512_maskz_loadu_ps(mask, static_cast<const float*>(base) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, static_cast<const uint16_t*>(base) + i);
    if constexpr (D == DType::kBF16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    else return _mm512_cvtph_ps(h);
  }
}

// MR weighted sums over 64 columns at a time (the last chunk masked); each
// output element is its own FMA chain over the rows, so lane width does not
// matter to the bits.
template <DType D, int MR>
void weighted_sum_tile(const float* w, int64_t ldw, const void* const* rows, int64_t count, int64_t n,
                       bool accumulate, float* out, int64_t ldo) {
  for (int64_t c = 0; c < n; c += 64) {
    __mmask16 mask[4];
    for (int i = 0; i < 4; ++i) {
      const int64_t left = std::clamp<int64_t>(n - c - 16 * i, 0, 16);
      mask[i] = static_cast<__mmask16>((1u << left) - 1u);
    }
    __m512 acc[MR][4];
    for (int m = 0; m < MR; ++m)
      for (int i = 0; i < 4; ++i)
        acc[m][i] = accumulate ? _mm512_maskz_loadu_ps(mask[i], out + m * ldo + c + 16 * i) : _mm512_setzero_ps();
    for (int64_t r = 0; r < count; ++r) {
      __m512 v[4];
      for (int i = 0; i < 4; ++i) v[i] = load16<D>(mask[i], rows[r], c + 16 * i);
      for (int m = 0; m < MR; ++m) {
        const __m512 wv = _mm512_set1_ps(w[m * ldw + r]);
        for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_fmadd_ps(wv, v[i], acc[m][i]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int i = 0; i < 4; ++i) _mm512_mask_storeu_ps(out + m * ldo + c + 16 * i, mask[i], acc[m][i]);
  }
}

template <DType D>
void weighted_sum_d(const float* w, int64_t ldw, int64_t M, const void* const* rows, int64_t count, int64_t n,
                    bool accumulate, float* out, int64_t ldo) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) weighted_sum_tile<D, 4>(w + m * ldw, ldw, rows, count, n, accumulate, out + m * ldo, ldo);
  switch (M - m) {
    case 3: weighted_sum_tile<D, 3>(w + m * ldw, ldw, rows, count, n, accumulate, out + m * ldo, ldo); break;
    case 2: weighted_sum_tile<D, 2>(w + m * ldw, ldw, rows, count, n, accumulate, out + m * ldo, ldo); break;
    case 1: weighted_sum_tile<D, 1>(w + m * ldw, ldw, rows, count, n, accumulate, out + m * ldo, ldo); break;
    default: break;
  }
}

void weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
                  bool accumulate, float* out, int64_t ldo) {
  with_dtype(kv, [&](auto d) { weighted_sum_d<decltype(d)::value>(w, ldw, M, rows, count, n, accumulate, out, ldo); });
}

template <DType D>
void matmul_d(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.panels) matmul_panels<D>(x, ldx, M, W, n0, n1, y, ldy);
  else matmul_rows<D>(x, ldx, M, W, n0, n1, y, ldy);
}

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (M < 4 && !W.panels) return avx2_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);
  with_dtype(W.dtype, [&](auto d) { matmul_d<decltype(d)::value>(x, ldx, M, W, n0, n1, y, ldy); });
}

}  // namespace

const KernelTable* avx512_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx2_kernels();
    if (!base || !__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512vl"))
      return nullptr;
    static const KernelTable t{"avx512", matmul, base->dot, base->axpy, dot_rows, weighted_sum};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
