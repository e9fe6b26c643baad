// INT8 activation rows and the integer building blocks shared by the INT8
// dot-product tables (kernels_avx512_vnni.cpp, kernels_amx.cpp). Included
// only by files compiled with AVX512-VNNI, in an unnamed namespace: each
// includer has its own copy.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "runtime/cpu/line_aligned.h"

namespace tandem::runtime::cpu {
namespace {

// A block of x's rows as quantize_int8_row makes them, the codes stored as
// q + 128 (unsigned), each row padded to a multiple of 64 bytes with q = 0,
// and rows of q = 0 (scale 0) added up to a multiple of row_multiple.
struct Int8Rows {
  LineVector<uint8_t> codes;  // rows of ld codes from a cache line (the AMX table loads tiles from them)
  std::vector<float> scale;
  int64_t ld = 0;

  void quantize(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t row_multiple = 1) {
    ld = (K + 63) / 64 * 64;
    const int64_t rows = (M + row_multiple - 1) / row_multiple * row_multiple;
    codes.resize(static_cast<std::size_t>(rows * ld));
    scale.resize(static_cast<std::size_t>(rows));
    for (int64_t m = 0; m < M; ++m) scale[static_cast<std::size_t>(m)] = row(x + m * ldx, K, codes.data() + m * ld);
    std::memset(codes.data() + M * ld, 128, static_cast<std::size_t>((rows - M) * ld));
    std::fill(scale.begin() + M, scale.end(), 0.0f);
  }

  // quantize_int8_row's codes and scale, 16 at a time; ld bytes written.
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
    const int64_t padded = ld;
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

}  // namespace
}  // namespace tandem::runtime::cpu
