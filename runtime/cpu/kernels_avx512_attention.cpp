// The AVX-512 table's attention kernels (kernels.h: dot_rows, weighted_sum,
// widen_fp8_row): the matrix tiles of avx512_tiles.h on row pointers, on
// float32, bf16, f16 and FP8 KV rows. Compiled with AVX-512 flags, like
// kernels_avx512.cpp; runs only through its table.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>

#include "runtime/cpu/avx512_tiles.h"
#include "runtime/cpu/fp8_kv_row.h"
#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

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
    return fp8_row_values16(mask, base, i, *fs);
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

}  // namespace

void avx512_dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count,
                     int64_t n, float* out, int64_t ldo) {
  dot_rows(q, ldq, M, kv, rows, count, n, out, ldo);
}
void avx512_weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count,
                         int64_t n, bool accumulate, float* out, int64_t ldo) {
  weighted_sum(w, ldw, M, kv, rows, count, n, accumulate, out, ldo);
}
void avx512_widen_fp8_row(const uint8_t* row, int64_t n, float* out) { widen_fp8_row(row, n, out); }

// quantize_fp8_row 16 values at a time: max |x| and finiteness (the max of finite floats is exact in any order),
// the same float32 division by the scale, and f32_to_f8e4m3's steps on each quotient's bits in the lanes.
void quantize_fp8_row_avx512(const float* x, int64_t n, uint8_t* row) {
  const auto mask_at = [n](int64_t i) {
    return n - i >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << (n - i)) - 1u);
  };
  const __m512i abs_bits = _mm512_set1_epi32(0x7FFFFFFF), inf = _mm512_set1_epi32(0x7F800000);
  __m512 amax = _mm512_setzero_ps();
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask_at(i);
    const __m512i a = _mm512_and_si512(_mm512_castps_si512(_mm512_maskz_loadu_ps(m, x + i)), abs_bits);
    bad |= _mm512_mask_cmpeq_epi32_mask(m, _mm512_and_si512(a, inf), inf);
    amax = _mm512_max_ps(amax, _mm512_castsi512_ps(a));
  }
  const float scale = bad ? std::numeric_limits<float>::quiet_NaN() : _mm512_reduce_max_ps(amax) / 448.0f;
  std::memcpy(row + n, &scale, sizeof scale);
  if (!(scale > 0.0f)) {
    std::memset(row, 0, static_cast<std::size_t>(n));
    return;
  }
  const __m512 s = _mm512_set1_ps(scale);
  const __m512i one = _mm512_set1_epi32(1);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = mask_at(i);
    const __m512i u = _mm512_castps_si512(_mm512_div_ps(_mm512_maskz_loadu_ps(m, x + i), s));
    const __m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
    const __m512i a = _mm512_and_si512(u, abs_bits);
    // from 2^-6: 3 mantissa bits kept, ties to even, the exponent less 120
    const __m512i r = _mm512_add_epi32(_mm512_add_epi32(a, _mm512_set1_epi32(0x7FFFF)),
                                       _mm512_and_si512(_mm512_srli_epi32(a, 20), one));
    const __m512i normal = _mm512_sub_epi32(_mm512_srli_epi32(r, 20), _mm512_set1_epi32(120 << 3));
    // below: |v| x 2^9 = m x 2^-sh rounded to an integer, ties to even (a shift of 32 or more gives 0)
    const __m512i e = _mm512_srli_epi32(a, 23);
    const __m512i mant = _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0x7FFFFF)),
                                         _mm512_maskz_set1_epi32(_mm512_test_epi32_mask(e, e), 0x800000));
    const __m512i sh = _mm512_sub_epi32(_mm512_set1_epi32(141), e);
    const __m512i q = _mm512_srlv_epi32(mant, sh);
    const __m512i rem = _mm512_and_si512(mant, _mm512_sub_epi32(_mm512_sllv_epi32(one, sh), one));
    const __m512i half = _mm512_sllv_epi32(one, _mm512_sub_epi32(sh, one));
    const __mmask16 up = _mm512_cmpgt_epi32_mask(rem, half) |
                         (_mm512_cmpeq_epi32_mask(rem, half) & _mm512_test_epi32_mask(q, one));
    __m512i code = _mm512_mask_add_epi32(q, up, q, one);
    code = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(sh, _mm512_set1_epi32(24)), code, _mm512_setzero_si512());
    code = _mm512_mask_blend_epi32(_mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x3C800000)), code, normal);
    code = _mm512_mask_blend_epi32(_mm512_cmpge_epi32_mask(a, _mm512_set1_epi32(0x43E00000)), code,
                                   _mm512_set1_epi32(0x7E));
    code = _mm512_or_si512(code, sign);
    code = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(a, inf), code, _mm512_set1_epi32(0x7F));
    _mm_mask_storeu_epi8(row + i, m, _mm512_cvtepi32_epi8(code));
  }
}

}  // namespace tandem::runtime::cpu
