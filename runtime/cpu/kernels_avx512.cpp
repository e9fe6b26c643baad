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
#include <cstring>
#include <cmath>
#include <type_traits>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/quantized_panel.h"

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


// MR rows of x against one 8-bit panel, stored (MR may be below 6: the last tile).
template <DType D, int MR>
inline void quantized_tile(int64_t mr, const float* x, int64_t ldx, const Matrix& W, int64_t n, float* y, int64_t ldy) {
  if constexpr (MR > 1) {
    if (mr < MR) return quantized_tile<D, MR - 1>(mr, x, ldx, W, n, y, ldy);
  }
  QPanel<D> q(W, n);
  __m512 r[(MR + 1) / 2];
  panel_folds_with<MR>(x, ldx, W.cols, [&](int64_t k, __m512 (&wv)[4]) { q.load(k, wv); }, r);
  store_folds<MR>(r, y, ldy);
}

// One panel of an 8-bit matrix as float, in panel order (for many rows of x).
template <DType D>
void dequantize_panel(const Matrix& W, int64_t n, float* out) {
  QPanel<D> q(W, n);
  for (int64_t k = 0; k < W.cols; k += 8) {
    __m512 wv[4];
    q.load(k, wv);
    for (int p = 0; p < 4; ++p) _mm512_storeu_ps(out + 8 * k + 16 * p, wv[p]);
  }
}

// Panels of an 8-bit matrix. A few rows of x: each panel's weights made
// float in registers as the tiles read them. Many: each panel dequantized
// once per block of x rows into float (it stays in L2), then the f32 row
// tiles read it. Either way the bytes streamed from memory are the codes: a
// quarter of f32's, half of bf16's.
template <DType D>
void matmul_panels_quantized(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                             int64_t ldy) {
  const int64_t K = W.cols;
  const int64_t t0 = std::min(n1, (n0 + 7) / 8 * 8);
  const int64_t t1 = std::max(t0, n1 / 8 * 8);
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 19) / (K * 4));  // ~512 KiB of x
  thread_local std::vector<float> wide;
  wide.resize(static_cast<std::size_t>(8 * K));
  constexpr int64_t kWiden = 16;
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    for (int64_t n = t0; n < t1; n += 8) {
      if (me - mb < kWiden) {
        near_equal_tiles<6>(mb, me, [&](int64_t m, int64_t mr) {
          quantized_tile<D, 6>(mr, x + m * ldx, ldx, W, n, y + m * ldy + n, ldy);
        });
        continue;
      }
      dequantize_panel<D>(W, n, wide.data());
      const auto* panel = reinterpret_cast<const uint8_t*>(wide.data());
      row_tiles<DType::kF32, 6, 4, 8, true>(mb, me, x, ldx, &panel, K, y + n, ldy);
    }
  }
  if (n0 < t0) matmul_dequantized(*avx512_kernels(), x, ldx, M, W, n0, t0, y, ldy);
  if (t1 < n1) matmul_dequantized(*avx512_kernels(), x, ldx, M, W, t1, n1, y, ldy);
}

// The row-parallel product on panels, fused: for each tile of MR rows and 8
// columns, every part's dot products (its own columns of x against its own
// panel, folded as matmul folds them) are added in the fixed tree while they
// are still in registers, and y is written once. Bitwise the same as
// matmul_tree_by_parts, without its partial matrices and passes over them.
constexpr int kMaxParts = 64;
constexpr int64_t kFusedRows = 8;  // fewer rows: matmul_tree_by_parts

template <DType D, int MR>
inline void tile_tree(const float* x, int64_t ldx, const uint8_t* const* panels, const int64_t* koff, const int64_t* kc,
                      int count, float* y, int64_t ldy) {
  constexpr int G = (MR + 1) / 2;
  __m512 stack[8][G];  // partial sums of subtrees; levels alongside
  int level[8];
  int depth = 0;
  for (int c = 0; c < count; ++c) {
    panel_folds<D, MR>(x + koff[c], ldx, panels[c], kc[c], stack[depth]);
    level[depth++] = 0;
    while (depth >= 2 && level[depth - 1] == level[depth - 2]) {
      for (int g = 0; g < G; ++g) stack[depth - 2][g] = _mm512_add_ps(stack[depth - 2][g], stack[depth - 1][g]);
      --depth;
      ++level[depth - 1];
    }
  }
  store_folds<MR>(stack[0], y, ldy);
}

template <DType D, int MR>
inline void tile_tree_rows(int64_t mr, const float* x, int64_t ldx, const uint8_t* const* panels, const int64_t* koff,
                           const int64_t* kc, int count, float* y, int64_t ldy) {
  if constexpr (MR == 1) {
    tile_tree<D, 1>(x, ldx, panels, koff, kc, count, y, ldy);
  } else {
    if (mr == MR) tile_tree<D, MR>(x, ldx, panels, koff, kc, count, y, ldy);
    else tile_tree_rows<D, MR - 1>(mr, x, ldx, panels, koff, kc, count, y, ldy);
  }
}

template <DType D>
void matmul_tree_panels(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                        float* y, int64_t ldy) {
  const auto es = static_cast<int64_t>(dtype_size(D));
  int64_t koff[kMaxParts], kc[kMaxParts], K = 0;
  for (int c = 0; c < count; ++c) {
    koff[c] = K;
    kc[c] = parts[c].cols;
    K += parts[c].cols;
  }
  const int64_t t0 = std::min(n1, (n0 + 7) / 8 * 8);
  const int64_t t1 = std::max(t0, n1 / 8 * 8);
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 19) / (K * 4));  // ~512 KiB of x
  thread_local std::vector<float> wide[kMaxParts];
  const uint8_t* panels[kMaxParts];
  constexpr int64_t kWiden = 16;  // fewer rows: converting in registers beats a widened copy
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    const bool widen = D != DType::kF32 && me - mb >= kWiden;
    for (int64_t n = t0; n < t1; n += 8) {
      for (int c = 0; c < count; ++c) {
        panels[c] = static_cast<const uint8_t*>(parts[c].data) + n * kc[c] * es;
        if (widen) panels[c] = reinterpret_cast<const uint8_t*>(panel_as_f32<D>(panels[c], kc[c], wide[c]));
      }
      near_equal_tiles<6>(mb, me, [&](int64_t m, int64_t mr) {
        if (widen) tile_tree_rows<DType::kF32, 6>(mr, x + m * ldx, ldx, panels, koff, kc, count, y + m * ldy + n, ldy);
        else tile_tree_rows<D, 6>(mr, x + m * ldx, ldx, panels, koff, kc, count, y + m * ldy + n, ldy);
      });
    }
  }
  if (n0 < t0) matmul_tree_by_parts(*avx512_kernels(), x, ldx, M, parts, count, n0, t0, y, ldy);
  if (t1 < n1) matmul_tree_by_parts(*avx512_kernels(), x, ldx, M, parts, count, t1, n1, y, ldy);
}

void matmul_tree(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  // A few rows are bound by reading the weights: each part is then streamed whole, as one region, rather
  // than the fused tiles' hops between the parts' panels every few KiB.
  bool fused = M >= kFusedRows && count <= kMaxParts && (count & (count - 1)) == 0;
  for (int c = 0; c < count && fused; ++c)
    fused = parts[c].panels && parts[c].dtype == parts[0].dtype && !parts[c].quantized();
  if (!fused) return matmul_tree_by_parts(*avx512_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
  with_dtype(parts[0].dtype,
             [&](auto d) { matmul_tree_panels<decltype(d)::value>(x, ldx, M, parts, count, n0, n1, y, ldy); });
}

// Attention scores: the queries are the rows of x, six keys make a tile
// (three pairs), exactly the matrix tile on row pointers.
// MR queries against eight keys (n % 8 == 0), the folds sixteen at a time
// as for a panel: the bits of fold() on each, in about a quarter of the
// instructions (at head_dim 128 the folds cost as much as the products).
template <int MR, class Load>
inline void key_tile(int64_t mr, const float* q, int64_t ldq, int64_t n, const Load& load, float* out, int64_t ldo) {
  if constexpr (MR > 1) {
    if (mr < MR) return key_tile<MR - 1>(mr, q, ldq, n, load, out, ldo);
  }
  __m512 r[(MR + 1) / 2];
  panel_folds_with<MR>(q, ldq, n, load, r);
  store_folds<MR>(r, out, ldo);
}

template <DType D>
void dot_rows_d(const float* q, int64_t ldq, int64_t M, const void* const* rows, int64_t count, int64_t n, float* out,
                int64_t ldo) {
  const auto* w = reinterpret_cast<const uint8_t* const*>(rows);
  int64_t r = 0;
  if (n % 8 == 0) {
    for (; r + 8 <= count; r += 8) {
      const uint8_t* const* k8 = w + r;
      const auto load = [k8](int64_t k, __m512 (&wv)[4]) {
        for (int p = 0; p < 4; ++p) wv[p] = load_pair<D, false>(k8[2 * p], k8[2 * p + 1], k);
      };
      near_equal_tiles<6>(0, M, [&](int64_t m, int64_t mr) {
        key_tile<6>(mr, q + m * ldq, ldq, n, load, out + m * ldo + r, ldo);
      });
    }
  }
  for (; r + 6 <= count; r += 6) row_tiles<D, 6, 3, 1, false>(0, M, q, ldq, w + r, n, out + r, ldo);
  if (r < count) avx2_kernels()->dot_rows(q, ldq, M, D, rows + r, count - r, n, out + r, ldo);
}

// An FP8 KV row's scale as widen_fp8_row applies it: times scale x 2^120
// after the code's bits (value x 2^-120, exact), or, where scale x 2^120
// would overflow (or the scale is NaN), times 2^120 and then the scale: the
// one rounding of value x scale either way.
struct Fp8RowScale {
  float plain, folded;
  bool two_step;
  Fp8RowScale(const void* row, int64_t n) {
    std::memcpy(&plain, static_cast<const uint8_t*>(row) + n, sizeof plain);
    two_step = !(plain < 0x1p7f);
    folded = plain * 0x1p120f;
  }
};

// 16 sign-extended FP8 codes as floats of value x 2^-120 (QPanel's three integer operations).
inline __m512 fp8_times_2m120(__m512i codes) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(_mm512_slli_epi32(codes, 20), _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u))));
}

// FP8 KV rows: eight keys a tile, their codes made floats in registers (the
// values widen_fp8_row gives: each pair's scales folded with 2^120, or all
// eight plain after a first x 2^120 where one would overflow), folded as
// key_tile folds. Keys past the last group of eight, and rows whose length is
// not a multiple of 8, take the widened path.
void dot_rows_fp8(const float* q, int64_t ldq, int64_t M, const void* const* rows, int64_t count, int64_t n,
                  float* out, int64_t ldo) {
  const auto* w = reinterpret_cast<const uint8_t* const*>(rows);
  int64_t r = 0;
  for (; n % 8 == 0 && r + 8 <= count; r += 8) {
    const uint8_t* const* k8 = w + r;
    bool two_step = false;
    Fp8RowScale s[8] = {{k8[0], n}, {k8[1], n}, {k8[2], n}, {k8[3], n}, {k8[4], n}, {k8[5], n}, {k8[6], n}, {k8[7], n}};
    for (const Fp8RowScale& x : s) two_step |= x.two_step;
    __m512 sv[4];
    for (int p = 0; p < 4; ++p)
      sv[p] = two_step ? _mm512_insertf32x8(_mm512_set1_ps(s[2 * p].plain), _mm256_set1_ps(s[2 * p + 1].plain), 1)
                       : _mm512_insertf32x8(_mm512_set1_ps(s[2 * p].folded), _mm256_set1_ps(s[2 * p + 1].folded), 1);
    const auto tiles = [&](auto two) {
      const auto load = [k8, &sv](int64_t k, __m512 (&wv)[4]) {
        for (int p = 0; p < 4; ++p) {
          const auto* even = reinterpret_cast<const __m128i*>(k8[2 * p] + k);
          const auto* odd = reinterpret_cast<const __m128i*>(k8[2 * p + 1] + k);
          const __m128i codes = _mm_unpacklo_epi64(_mm_loadl_epi64(even), _mm_loadl_epi64(odd));
          __m512 v = fp8_times_2m120(_mm512_cvtepi8_epi32(codes));
          if constexpr (decltype(two)::value) v = _mm512_mul_ps(v, _mm512_set1_ps(0x1p120f));
          wv[p] = _mm512_mul_ps(v, sv[p]);
        }
      };
      near_equal_tiles<6>(0, M, [&](int64_t m, int64_t mr) {
        key_tile<6>(mr, q + m * ldq, ldq, n, load, out + m * ldo + r, ldo);
      });
    };
    if (two_step) tiles(std::true_type{});
    else tiles(std::false_type{});
  }
  if (r < count) dot_rows_widened(*avx512_kernels(), q, ldq, M, rows + r, count - r, n, out + r, ldo);
}

void dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
              float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3) return dot_rows_fp8(q, ldq, M, rows, count, n, out, ldo);
  with_dtype(kv, [&](auto d) { dot_rows_d<decltype(d)::value>(q, ldq, M, rows, count, n, out, ldo); });
}

// Sixteen elements from i on (those the mask keeps), widened to float (an
// FP8 row's: times its scale, fs).
template <DType D>
inline __m512 load16(__mmask16 mask, const void* base, int64_t i, const Fp8RowScale* fs = nullptr) {
  if constexpr (D == DType::kF8E4M3) {
    const __m512i b = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(base) + i));
    const __m512 v = fp8_times_2m120(b);
    if (fs->two_step) return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0x1p120f)), _mm512_set1_ps(fs->plain));
    return _mm512_mul_ps(v, _mm512_set1_ps(fs->folded));
  } else if constexpr (D == DType::kF32) {
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
      if constexpr (D == DType::kF8E4M3) {
        const Fp8RowScale fs(rows[r], n);
        for (int i = 0; i < 4; ++i) v[i] = load16<D>(mask[i], rows[r], c + 16 * i, &fs);
      } else {
        for (int i = 0; i < 4; ++i) v[i] = load16<D>(mask[i], rows[r], c + 16 * i);
      }
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
  // Blocks of rows (a block stays in L1/L2 while every query tile passes it), the
  // outputs carried between blocks in memory: each element's chain unchanged.
  constexpr int64_t kRowBlock = 128;
  int64_t r0 = 0;
  do {  // once at least: count 0 without accumulate zeroes the outputs
    const int64_t rc = std::min(kRowBlock, count - r0);
    const bool acc = accumulate || r0 > 0;
    near_equal_tiles<6>(0, M, [&](int64_t m, int64_t mr) {  // at most 6 queries: 24 accumulators
      const float* wm = w + m * ldw + r0;
      float* om = out + m * ldo;
      switch (mr) {
        case 6: weighted_sum_tile<D, 6>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
        case 5: weighted_sum_tile<D, 5>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
        case 4: weighted_sum_tile<D, 4>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
        case 3: weighted_sum_tile<D, 3>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
        case 2: weighted_sum_tile<D, 2>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
        default: weighted_sum_tile<D, 1>(wm, ldw, rows + r0, rc, n, acc, om, ldo); break;
      }
    });
    r0 += kRowBlock;
  } while (r0 < count);
}

void weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
                  bool accumulate, float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3)
    return weighted_sum_d<DType::kF8E4M3>(w, ldw, M, rows, count, n, accumulate, out, ldo);
  with_dtype(kv, [&](auto d) { weighted_sum_d<decltype(d)::value>(w, ldw, M, rows, count, n, accumulate, out, ldo); });
}

// An FP8 KV row as floats, 16 at a time: load16's arithmetic.
void widen_fp8_row(const uint8_t* row, int64_t n, float* out) {
  const Fp8RowScale fs(row, n);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = static_cast<__mmask16>((1u << std::min<int64_t>(16, n - i)) - 1u);
    _mm512_mask_storeu_ps(out + i, mask, load16<DType::kF8E4M3>(mask, row, i, &fs));
  }
}

template <DType D>
void matmul_d(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.panels) matmul_panels<D>(x, ldx, M, W, n0, n1, y, ldy);
  else matmul_rows<D>(x, ldx, M, W, n0, n1, y, ldy);
}

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.quantized()) {
    if (!quantized_panels_ok(W)) return matmul_dequantized(*avx512_kernels(), x, ldx, M, W, n0, n1, y, ldy);
    if (W.dtype == DType::kF8E4M3) return matmul_panels_quantized<DType::kF8E4M3>(x, ldx, M, W, n0, n1, y, ldy);
    return matmul_panels_quantized<DType::kI8>(x, ldx, M, W, n0, n1, y, ldy);
  }
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
    static const KernelTable t{"avx512", matmul, base->dot, base->axpy, dot_rows, weighted_sum, matmul_tree,
                               widen_fp8_row, softmax_avx512};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
