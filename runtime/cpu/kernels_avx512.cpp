// AVX-512 matrix kernels, and the AVX-512 table (this file and
// kernels_avx512_attention.cpp are compiled with AVX-512 flags; they run only
// after the CPU says it has them).
//
// Same arithmetic as the AVX2 and scalar tables, bit for bit, on the tiles of
// avx512_tiles.h: every lane does exactly the FMA chain of kernels.h; the
// wider registers only do two columns per instruction. Small batches (fewer
// than 4 rows, memory-bound) and the vector operations use the AVX2 code.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <vector>

#include "runtime/cpu/avx512_tiles.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/quantized_panel.h"
#include "runtime/cpu/row_parallel.h"

namespace tandem::runtime::cpu {
namespace {

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
  __m512 stack[8][G];  // partial sums of subtrees
  TreeLevels levels;
  for (int c = 0; c < count; ++c) {
    panel_folds<D, MR>(x + koff[c], ldx, panels[c], kc[c], stack[levels.depth()]);
    levels.push([&](int l, int r) {
      for (int g = 0; g < G; ++g) stack[l][g] = _mm512_add_ps(stack[l][g], stack[r][g]);
    });
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
    static const KernelTable t{"avx512", matmul, base->dot, base->axpy, avx512_dot_rows, avx512_weighted_sum,
                               matmul_tree, avx512_widen_fp8_row, softmax_avx512};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
