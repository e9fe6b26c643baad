// The bf16 dot-product table (kernels.h): AVX512-BF16's vdpbf16ps on bf16
// panels, where a multiply-add instruction does twice the products of an
// FP32 FMA. This file alone is compiled with -mavx512bf16; it runs only
// after the CPU says it has it. Everything but the bf16 panel products is
// the AVX-512 table's.
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "runtime/cpu/bf16_panels.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/quantized_panel.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int kMaxParts = 64;

// Sixteen 4-lane dot products folded: r[i] holds columns 4i..4i+3, lanes
// 0-3 each; lane c of the result is column c's (l0 + l2) + (l1 + l3).
inline __m512 fold4x4(const __m512 (&r)[4]) {
  __m512 v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm512_add_ps(r[i], _mm512_permute_ps(r[i], _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 w0 = _mm512_shuffle_ps(v[0], v[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 w1 = _mm512_shuffle_ps(v[2], v[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 x0 = _mm512_add_ps(w0, _mm512_permute_ps(w0, _MM_SHUFFLE(2, 3, 0, 1)));
  const __m512 x1 = _mm512_add_ps(w1, _mm512_permute_ps(w1, _MM_SHUFFLE(2, 3, 0, 1)));
  // quarter q, position i: register i's column q of its four
  const __m512 t = _mm512_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, t);
}

// MR rows of bf16 x (row stride ldx) against P consecutive bf16 panels (8
// columns each, K % 8 == 0): out[m] = row m's 8 P dot products (P = 1: the
// upper half 0). Each column keeps 4 lanes; lane j adds, k-group by k-group,
// the pair (8g + 2j + 1) then (8g + 2j), as vdpbf16ps does.
template <int MR, int P>
inline void bf16_panel_dots(const uint16_t* x, int64_t ldx, const uint8_t* panel, int64_t K, __m512 (&out)[MR]) {
  constexpr int R = 2 * P;  // zmm of weights a k-group: 4 columns x 8 k each
  __m512 acc[MR][R];
  for (int m = 0; m < MR; ++m)
    for (int r = 0; r < R; ++r) acc[m][r] = _mm512_setzero_ps();
  const auto* w = reinterpret_cast<const uint16_t*>(panel);
  for (int64_t k = 0; k < K; k += 8) {
    for (int pp = 0; pp < P; ++pp)  // each panel a stream of its own, fetched ahead
      for (int b = 0; b < 128; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w + pp * 8 * K + 8 * k) + 1024 + b, _MM_HINT_T0);
    __m512bh wv[R];
    for (int r = 0; r < R; ++r)  // panel r / 2, columns 4 (r % 2)..+3: 64 bytes at its k-group
      wv[r] = (__m512bh)_mm512_loadu_si512(w + (r / 2) * 8 * K + 8 * k + 32 * (r % 2));
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + m * ldx + k)));
      for (int r = 0; r < R; ++r) acc[m][r] = _mm512_dpbf16_ps(acc[m][r], xv, wv[r]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    const __m512 r4[4] = {acc[m][0], acc[m][1], R > 2 ? acc[m][std::min(2, R - 1)] : _mm512_setzero_ps(),
                          R > 2 ? acc[m][std::min(3, R - 1)] : _mm512_setzero_ps()};
    out[m] = fold4x4(r4);
  }
}

// Lanes [c0, c1) of a row's 16 (or 8) results into y[c0, c1) (y: the tile's first column).
inline void store_columns(__m512 r, float* y, int c0, int c1) {
  const __mmask16 mask = static_cast<__mmask16>(((1u << c1) - 1u) & ~((1u << c0) - 1u));
  _mm512_mask_storeu_ps(y, mask, r);
}

template <int MR, int P>
inline void bf16_tile(const uint16_t* x, int64_t ldx, const uint8_t* panel, int64_t K, float* y, int64_t ldy, int c0,
                      int c1) {
  __m512 r[MR];
  bf16_panel_dots<MR, P>(x, ldx, panel, K, r);
  for (int m = 0; m < MR; ++m) store_columns(r[m], y + m * ldy, c0, c1);
}

template <int MR, int P>
inline void bf16_tile_rows(int64_t mr, const uint16_t* x, int64_t ldx, const uint8_t* panel, int64_t K, float* y,
                           int64_t ldy, int c0, int c1) {
  if constexpr (MR == 1) {
    bf16_tile<1, P>(x, ldx, panel, K, y, ldy, c0, c1);
  } else {
    if (mr == MR) bf16_tile<MR, P>(x, ldx, panel, K, y, ldy, c0, c1);
    else bf16_tile_rows<MR - 1, P>(mr, x, ldx, panel, K, y, ldy, c0, c1);
  }
}

// The panels that hold columns [n0, n1), two at a time (a last odd one
// alone), every column of a panel computed and only [n0, n1) stored: a
// column's bits never depend on which tile (or thread) it fell in.
template <class Tile>
void for_panels(int64_t n0, int64_t n1, bool pairs, const Tile& tile) {
  for (int64_t p = n0 / 8 * 8; p < n1;) {
    const int two = pairs && p + 8 < n1 ? 2 : 1;
    const int c0 = static_cast<int>(std::max<int64_t>(n0, p) - p);
    const int c1 = static_cast<int>(std::min<int64_t>(n1, p + 8 * two) - p);
    tile(p, two, c0, c1);
    p += 8 * two;
  }
}

// MR rows of bf16 x against one 8-bit panel: its weights' values (code x
// scale, QPanel) rounded to bf16 in registers (vcvtne2ps2bf16, nearest even),
// 32 a zmm in the bf16 panel's order, then exactly bf16_panel_dots<MR, 1>.
template <DType D, int MR>
inline void quantized_bf16_tile(int64_t mr, const uint16_t* x, int64_t ldx, const Matrix& W, int64_t p, float* y,
                                int64_t ldy, int c0, int c1) {
  if constexpr (MR > 1) {
    if (mr < MR) return quantized_bf16_tile<D, MR - 1>(mr, x, ldx, W, p, y, ldy, c0, c1);
  }
  QuantizedPanelReader<D> q(W, p);
  __m512 acc[MR][2];
  for (int m = 0; m < MR; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < W.cols; k += 8) {
    __m512i lo, hi;
    q.load(k, lo, hi);
    const __m512bh wv[2] = {(__m512bh)lo, (__m512bh)hi};  // rows 0-3, 4-7
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = (__m512bh)_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + m * ldx + k)));
      acc[m][0] = _mm512_dpbf16_ps(acc[m][0], xv, wv[0]);
      acc[m][1] = _mm512_dpbf16_ps(acc[m][1], xv, wv[1]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    const __m512 r4[4] = {acc[m][0], acc[m][1], _mm512_setzero_ps(), _mm512_setzero_ps()};
    store_columns(fold4x4(r4), y + m * ldy, c0, c1);
  }
}

template <DType D>
void matmul_bf16dot_quantized(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                              int64_t ldy) {
  const int64_t K = W.cols;
  thread_local LineVector<uint16_t> xb, wide;
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 18) / (K * 2));
  constexpr int64_t kWiden = 16;  // more rows: each panel made bf16 once, the bf16 panels' tiles read it
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    const uint16_t* xr = rows_as_bf16(x + mb * ldx, ldx, me - mb, K, xb);
    if (me - mb >= kWiden) {
      wide.resize(static_cast<std::size_t>(16 * K));
      for_panels(n0, n1, true, [&](int64_t p, int two, int c0, int c1) {
        for (int i = 0; i < two; ++i) quantized_panel_as_bf16<D>(W, p + 8 * i, wide.data() + 8 * i * K);
        const auto* panel = reinterpret_cast<const uint8_t*>(wide.data());
        for (int64_t m = mb, left = (me - mb + 5) / 6; left > 0; --left) {
          const int64_t mr = (me - m + left - 1) / left;
          if (two == 2) bf16_tile_rows<6, 2>(mr, xr + (m - mb) * K, K, panel, K, y + m * ldy + p, ldy, c0, c1);
          else bf16_tile_rows<6, 1>(mr, xr + (m - mb) * K, K, panel, K, y + m * ldy + p, ldy, c0, c1);
          m += mr;
        }
      });
      continue;
    }
    for_panels(n0, n1, false, [&](int64_t p, int, int c0, int c1) {
      for (int64_t m = mb, left = (me - mb + 5) / 6; left > 0; --left) {
        const int64_t mr = (me - m + left - 1) / left;
        quantized_bf16_tile<D, 6>(mr, xr + (m - mb) * K, K, W, p, y + m * ldy + p, ldy, c0, c1);
        m += mr;
      }
    });
  }
}

void matmul_bf16dot(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                    int64_t ldy) {
  if (W.quantized() && quantized_panels_ok(W)) {  // 8-bit panels: their values rounded to bf16
    if (W.dtype == DType::kF8E4M3) return matmul_bf16dot_quantized<DType::kF8E4M3>(x, ldx, M, W, n0, n1, y, ldy);
    return matmul_bf16dot_quantized<DType::kI8>(x, ldx, M, W, n0, n1, y, ldy);
  }
  if (!W.panels || W.dtype != DType::kBF16) return avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);  // FP32's contract
  const int64_t K = W.cols;
  thread_local LineVector<uint16_t> xb;
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 18) / (K * 2));  // ~256 KiB of bf16 x
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    const uint16_t* xr = rows_as_bf16(x + mb * ldx, ldx, me - mb, K, xb);
    for_panels(n0, n1, me - mb >= 4, [&](int64_t p, int two, int c0, int c1) {
      const auto* panel = static_cast<const uint8_t*>(W.data) + p * K * 2;
      for (int64_t m = mb, left = (me - mb + 5) / 6; left > 0; --left) {
        const int64_t mr = (me - m + left - 1) / left;
        if (two == 2) bf16_tile_rows<6, 2>(mr, xr + (m - mb) * K, K, panel, K, y + m * ldy + p, ldy, c0, c1);
        else bf16_tile_rows<6, 1>(mr, xr + (m - mb) * K, K, panel, K, y + m * ldy + p, ldy, c0, c1);
        m += mr;
      }
    });
  }
}

// The row-parallel product: each part's folded tile added in the fixed tree in registers.
template <int MR, int P>
inline void bf16_tile_tree(const uint16_t* x, int64_t ldx, const uint8_t* const* panels, const int64_t* koff,
                           const int64_t* kc, int count, float* y, int64_t ldy, int c0, int c1) {
  __m512 stack[8][MR];
  int level[8];
  int depth = 0;
  for (int c = 0; c < count; ++c) {
    bf16_panel_dots<MR, P>(x + koff[c], ldx, panels[c], kc[c], stack[depth]);
    level[depth++] = 0;
    while (depth >= 2 && level[depth - 1] == level[depth - 2]) {
      for (int m = 0; m < MR; ++m) stack[depth - 2][m] = _mm512_add_ps(stack[depth - 2][m], stack[depth - 1][m]);
      --depth;
      ++level[depth - 1];
    }
  }
  for (int m = 0; m < MR; ++m) store_columns(stack[0][m], y + m * ldy, c0, c1);
}

template <int MR, int P>
inline void bf16_tile_tree_rows(int64_t mr, const uint16_t* x, int64_t ldx, const uint8_t* const* panels,
                                const int64_t* koff, const int64_t* kc, int count, float* y, int64_t ldy, int c0,
                                int c1) {
  if constexpr (MR == 1) {
    bf16_tile_tree<1, P>(x, ldx, panels, koff, kc, count, y, ldy, c0, c1);
  } else {
    if (mr == MR) bf16_tile_tree<MR, P>(x, ldx, panels, koff, kc, count, y, ldy, c0, c1);
    else bf16_tile_tree_rows<MR - 1, P>(mr, x, ldx, panels, koff, kc, count, y, ldy, c0, c1);
  }
}

void matmul_tree_bf16dot(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0,
                         int64_t n1, float* y, int64_t ldy) {
  bool eight_bit = true;  // 8-bit panels: each part's product as matmul_bf16dot makes it, added in the tree
  for (int c = 0; c < count && eight_bit; ++c) eight_bit = parts[c].quantized() && quantized_panels_ok(parts[c]);
  if (eight_bit) return matmul_tree_by_parts(*avx512_bf16_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
  bool ours = count <= kMaxParts && (count & (count - 1)) == 0;
  for (int c = 0; c < count && ours; ++c) ours = parts[c].panels && parts[c].dtype == DType::kBF16;
  if (!ours) return avx512_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);  // FP32's contract
  // A few rows are bound by reading the weights: each part streamed whole (as the FP32 table does).
  if (M < 8) return matmul_tree_by_parts(*avx512_bf16_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
  int64_t koff[kMaxParts], kc[kMaxParts], K = 0;
  for (int c = 0; c < count; ++c) {
    koff[c] = K;
    kc[c] = parts[c].cols;
    K += parts[c].cols;
  }
  thread_local LineVector<uint16_t> xb;
  const uint8_t* panels[kMaxParts];
  const int64_t m_block = std::max<int64_t>(6, (int64_t{1} << 18) / (K * 2));
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    const uint16_t* xr = rows_as_bf16(x + mb * ldx, ldx, me - mb, K, xb);
    for_panels(n0, n1, me - mb >= 4, [&](int64_t p, int two, int c0, int c1) {
      for (int c = 0; c < count; ++c) panels[c] = static_cast<const uint8_t*>(parts[c].data) + p * kc[c] * 2;
      for (int64_t m = mb, left = (me - mb + 5) / 6; left > 0; --left) {
        const int64_t mr = (me - m + left - 1) / left;
        if (two == 2)
          bf16_tile_tree_rows<6, 2>(mr, xr + (m - mb) * K, K, panels, koff, kc, count, y + m * ldy + p, ldy, c0, c1);
        else
          bf16_tile_tree_rows<6, 1>(mr, xr + (m - mb) * K, K, panels, koff, kc, count, y + m * ldy + p, ldy, c0, c1);
        m += mr;
      }
    });
  }
}

}  // namespace

const KernelTable* avx512_bf16_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_kernels();
    if (!base || !__builtin_cpu_supports("avx512bf16")) return nullptr;
    static const KernelTable t{"avx512-bf16", matmul_bf16dot, base->dot, base->axpy, base->dot_rows,
                               base->weighted_sum, matmul_tree_bf16dot, base->widen_fp8_row, base->softmax};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
