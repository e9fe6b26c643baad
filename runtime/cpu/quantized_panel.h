// Reading an 8-bit matrix's panels (weights.h: codes and their scales) as
// float, for the AVX-512 tables. Included only by files compiled with
// AVX-512 flags, and in an unnamed namespace: each includer has its own copy.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "runtime/model/weights.h"

namespace tandem::runtime::cpu {
namespace {

// Whether QPanel can read W: panels whose column blocks start on multiples of
// 8 (a panel's 8 columns of a k-group then share one scale per row). Codes
// 0x7F / 0xFF (FP8 NaN) never get here: they are refused when panels are made.
inline bool quantized_panels_ok(const Matrix& W) {
  return W.panels && W.scales.block_cols % 8 == 0 && W.scales.c0 % 8 == 0;
}

// The scales of one panel (8 rows) of an 8-bit matrix, a column block at a
// time: at(j) is row j's scale in the current block, which covers columns
// up to `next` (of the matrix or view); advance() moves to the next block.
// Column blocks start on multiples of 8 (quantized_panels_ok), so a k-group
// of 8 columns never straddles two.
struct PanelScales {
  const float* srow[8];
  int64_t block_cols, cb, next;

  PanelScales(const Matrix& W, int64_t n) {
    const Scales& s = W.scales;
    int64_t q = (n + s.r0) / s.block_rows, r = (n + s.r0) % s.block_rows;  // one division, not eight
    for (int j = 0; j < 8; ++j) {
      srow[j] = s.grid + q * s.ld;
      if (n + j + 1 < W.rows && ++r == s.block_rows) {  // past the last row: its scales again
        ++q;
        r = 0;
      }
    }
    block_cols = s.block_cols;
    cb = s.c0 / block_cols;
    next = (cb + 1) * block_cols - s.c0;
  }
  float at(int j) const { return srow[j][cb]; }
  void advance() {
    ++cb;
    next += block_cols;
  }
};

// Reads one panel (8 rows) of an 8-bit matrix as float, 16 weights (rows 2p
// and 2p + 1, 8 columns) at a time, keeping its rows' scales for the current
// column block in registers. FP8: the code's sign and 7 bits moved into a
// float's (sign extension, shift, mask: an exact float of the code's value
// times 2^-120, subnormal for the code's subnormals), times scale x 2^120
// (exact: a power of two) in one multiply, the one rounding of code x scale;
// where scale x 2^120 would overflow, times 2^120 first, then the scale.
// INT8: converted, times the scale.
template <DType D>
struct QPanel {
  const uint8_t* codes;
  PanelScales s;
  __m512 sv[4];
  bool two_step = false;

  QPanel(const Matrix& W, int64_t n) : codes(static_cast<const uint8_t*>(W.data) + W.index(n, 0)), s(W, n) {
    scales();
  }
  void scales() {
    two_step = false;
    for (int p = 0; p < 4; ++p) {
      __m512 v = _mm512_insertf32x8(_mm512_set1_ps(s.at(2 * p)), _mm256_set1_ps(s.at(2 * p + 1)), 1);
      if constexpr (D == DType::kF8E4M3) {
        two_step |= _mm512_cmp_ps_mask(v, _mm512_set1_ps(0x1p7f), _CMP_GE_OQ) != 0;  // x 2^120 overflows past 2^127
        if (!two_step) v = _mm512_mul_ps(v, _mm512_set1_ps(0x1p120f));
      }
      sv[p] = v;
    }
    if (two_step)  // undo any folded 2^120: all four plain
      for (int p = 0; p < 4; ++p)
        sv[p] = _mm512_insertf32x8(_mm512_set1_ps(s.at(2 * p)), _mm256_set1_ps(s.at(2 * p + 1)), 1);
  }
  __attribute__((always_inline)) inline void load(int64_t k, __m512 (&wv)[4]) {
    if (k >= s.next) {
      s.advance();
      scales();
    }
    _mm_prefetch(reinterpret_cast<const char*>(codes + 8 * k + 16384), _MM_HINT_T0);  // one stream, 16 KiB ahead
    for (int p = 0; p < 4; ++p) {
      const __m512i b = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + 8 * k + 16 * p)));
      if constexpr (D == DType::kF8E4M3) {
        __m512 v = _mm512_castsi512_ps(
            _mm512_and_si512(_mm512_slli_epi32(b, 20), _mm512_set1_epi32(static_cast<int32_t>(0x87F00000u))));
        if (two_step) v = _mm512_mul_ps(v, _mm512_set1_ps(0x1p120f));
        wv[p] = _mm512_mul_ps(v, sv[p]);
      } else {
        wv[p] = _mm512_mul_ps(_mm512_cvtepi32_ps(b), sv[p]);
      }
    }
  }
};

}  // namespace
}  // namespace tandem::runtime::cpu
