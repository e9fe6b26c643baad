// An FP8 KV row's values (kernels.h quantize_fp8_row: E4M3 codes, then the row's float scale) 16 at a time in
// AVX-512 registers, each code's value times the scale rounded once, as every table widens them (widen_fp8_row,
// the attention kernels). Included by files compiled with AVX-512F or more, in an unnamed namespace: each
// includer has its own copy.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

namespace tandem::runtime::cpu {
namespace {

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

// The row's values i to i + 15 (those the mask keeps; the others 0).
inline __m512 fp8_row_values16(__mmask16 mask, const void* row, int64_t i, const Fp8RowScale& fs) {
  const __m512i b = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, static_cast<const uint8_t*>(row) + i));
  const __m512 v = fp8_times_2m120(b);
  if (fs.two_step) return _mm512_mul_ps(_mm512_mul_ps(v, _mm512_set1_ps(0x1p120f)), _mm512_set1_ps(fs.plain));
  return _mm512_mul_ps(v, _mm512_set1_ps(fs.folded));
}

}  // namespace
}  // namespace tandem::runtime::cpu
