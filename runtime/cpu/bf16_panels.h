// bf16 operands of the bf16 tables (kernels_avx512_bf16.cpp,
// kernels_avx512_bf16amx.cpp, kernels_amx_bf16.cpp): x's rows rounded to bf16, and a panel's k-groups as
// bf16 whether the panel holds bf16 weights or 8-bit codes and scales. Included
// only by files compiled with AVX512-BF16, in an unnamed namespace: each
// includer has its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/cpu/line_aligned.h"
#include "runtime/cpu/quantized_panel.h"

namespace tandem::runtime::cpu {
namespace {

// n floats rounded to bf16 (vcvtneps2bf16: nearest even, a subnormal to 0) at dst, zeros on to np.
inline void floats_as_bf16(const float* src, int64_t n, int64_t np, uint16_t* dst) {
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 m = n - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - k)) - 1u);
    _mm256_mask_storeu_epi16(dst + k, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, src + k)));
  }
  std::memset(dst + n, 0, static_cast<std::size_t>(np - n) * 2);
}

// x's rows rounded to bf16 (floats_as_bf16), row m at buf + m * ld; columns [K, ld) and rows [M, rows) zeros
// (ld >= K, rows >= M; by default neither padded).
inline const uint16_t* rows_as_bf16(const float* x, int64_t ldx, int64_t M, int64_t K, LineVector<uint16_t>& buf,
                                    int64_t ld = 0, int64_t rows = 0) {
  ld = ld ? ld : K;
  rows = rows ? rows : M;
  buf.resize(static_cast<std::size_t>(rows * ld) + 16);
  for (int64_t m = 0; m < M; ++m) floats_as_bf16(x + m * ldx, K, ld, buf.data() + m * ld);
  std::memset(buf.data() + M * ld, 0, static_cast<std::size_t>((rows - M) * ld) * 2);
  return buf.data();
}

// x's rows rounded to bf16 (as rows_as_bf16) in the A tiles' layout at out: 16 rows by 32 k a tile of 1 KiB
// (row m's 32 k at 32 m), a block of 16 rows' tiles in k order; k past K and rows past M (up to `rows`) zeros.
// A tile loads from one contiguous KiB: rows of x at a stride of 2-6 KiB fell on two L1 sets (one at 4 KiB)
// and a tile load missed its own rows.
inline void rows_as_bf16_tiles(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t Kp, int64_t rows,
                               uint16_t* out) {
  const int64_t steps = Kp / 32;
  for (int64_t m = 0; m < rows; ++m) {
    uint16_t* dst = out + (m / 16) * steps * 512 + (m % 16) * 32;
    if (m >= M) {
      for (int64_t s = 0; s < steps; ++s) _mm512_storeu_si512(dst + s * 512, _mm512_setzero_si512());
      continue;
    }
    const float* src = x + m * ldx;
    for (int64_t s = 0; s < steps; ++s) {
      const int64_t k = 32 * s;
      const __mmask16 lo = k + 16 <= K ? 0xffff : k < K ? static_cast<__mmask16>((1u << (K - k)) - 1u) : 0;
      const __mmask16 hi = k + 32 <= K ? 0xffff : k + 16 < K ? static_cast<__mmask16>((1u << (K - k - 16)) - 1u) : 0;
      const __m512 a = _mm512_maskz_loadu_ps(lo, src + k), b = _mm512_maskz_loadu_ps(hi, src + k + 16);
      _mm512_storeu_si512(dst + s * 512, (__m512i)_mm512_cvtne2ps_pbh(b, a));
    }
  }
}

// A bf16 panel's k-groups in order: lo = columns 0-3, hi = columns 4-7, each
// column's 8 k side by side (the panel layout, weights.h).
struct Bf16PanelReader {
  const uint16_t* w;
  Bf16PanelReader(const Matrix& W, int64_t p) : w(static_cast<const uint16_t*>(W.data) + p * W.cols) {}
  void load(int64_t k, __m512i& lo, __m512i& hi) const {
    lo = _mm512_loadu_si512(w + 8 * k);
    hi = _mm512_loadu_si512(w + 8 * k + 32);
  }
};

// The same from an 8-bit panel: its values (code x scale, QPanel) rounded to
// bf16 (vcvtne2ps2bf16: nearest even, a subnormal to 0). k in increasing order.
template <DType D>
struct QuantizedPanelReader {
  QPanel<D> q;
  QuantizedPanelReader(const Matrix& W, int64_t p) : q(W, p) {}
  void load(int64_t k, __m512i& lo, __m512i& hi) {
    __m512 f[4];
    q.load(k, f);  // rows 2j, 2j + 1 at columns k..k+7, as float
    lo = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]);
    hi = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]);
  }
};

// One 8-bit panel's values rounded to bf16, into out in the bf16 panel layout.
template <DType D>
void quantized_panel_as_bf16(const Matrix& W, int64_t p, uint16_t* out) {
  QuantizedPanelReader<D> r(W, p);
  for (int64_t k = 0; k < W.cols; k += 8) {
    __m512i lo, hi;
    r.load(k, lo, hi);
    _mm512_storeu_si512(out + 8 * k, lo);
    _mm512_storeu_si512(out + 8 * k + 32, hi);
  }
}

}  // namespace
}  // namespace tandem::runtime::cpu
