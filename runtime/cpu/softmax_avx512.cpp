// Attention's softmax and the MLPs' SwiGLU on AVX-512 (kernels.h states the
// arithmetic; every table gives the same bits). Compiled with AVX-512 flags;
// called only where the CPU has AVX-512.
#include <immintrin.h>

#include <cmath>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

// kernels.h's exp_fixed, sixteen at a time (vscalefps: y x 2^n rounded once).
inline __m512 exp16(__m512 d) {
  const __m512 x = _mm512_max_ps(_mm512_set1_ps(-104.0f), d);  // a NaN d stays NaN
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.9875691500e-4f), r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

}  // namespace

// kernels.h's SwiGLU, sixteen at a time.
void swiglu_avx512(float* g, const float* u, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 x = _mm512_maskz_loadu_ps(k, g + i);
    const __m512 e = exp16(_mm512_or_ps(x, sign));  // -|x|
    const __mmask16 ge = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
    const __m512 s = _mm512_div_ps(_mm512_mask_blend_ps(ge, e, one), _mm512_add_ps(one, e));
    const __m512 r = _mm512_mul_ps(_mm512_mul_ps(x, s), _mm512_maskz_loadu_ps(k, u + i));
    const __mmask16 nan = _mm512_cmp_ps_mask(r, r, _CMP_UNORD_Q);
    _mm512_mask_storeu_ps(g + i, k, _mm512_mask_blend_ps(nan, r, _mm512_castsi512_ps(_mm512_set1_epi32(0x7fc00000))));
  }
}

// kernels.h's softmax: lane i of the sum is lane i of the register.
void softmax_avx512(float* s, int64_t n, float scale) {
  const __m512 sc = _mm512_set1_ps(scale);
  auto mask_at = [n](int64_t j) { return static_cast<__mmask16>(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1u); };
  __m512 maxv = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = mask_at(j);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, s + j), sc);
    _mm512_mask_storeu_ps(s + j, k, x);
    maxv = _mm512_mask_max_ps(maxv, k, x, maxv);
  }
  const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(maxv));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = mask_at(j);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + j), mx));
    _mm512_mask_storeu_ps(s + j, k, e);
    sum = _mm512_mask_add_ps(sum, k, sum, e);
  }
  __m256 h = _mm256_add_ps(_mm512_castps512_ps256(sum), _mm512_extractf32x8_ps(sum, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
  const float t = _mm_cvtss_f32(q);
  const __m512 total = _mm512_set1_ps(t);
  // e_j / total rounded once, without a division per vector (vdivps was half this softmax's time in a long
  // prefill): y = 1 / total rounded, q = e_j y rounded, r = e_j - q total (exact, one FMA), q + r y rounded is the
  // quotient rounded (Markstein's theorem: y within half an ulp of 1 / total, q within an ulp of the quotient, and
  // nothing near underflow). total >= 1 (the largest score's term is exactly 1), so a quotient is far from
  // underflow where e_j >= total x 2^-96; a vector with a smaller e_j (or 0) divides, as a row with a NaN score
  // does (the division's own NaNs).
  const bool finite = std::isfinite(t);
  const __m512 y = _mm512_set1_ps(1.0f / t), small = _mm512_set1_ps(t * 0x1p-96f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = mask_at(j);
    const __m512 e = _mm512_maskz_loadu_ps(k, s + j);
    __m512 w;
    if (!finite || _mm512_mask_cmp_ps_mask(k, e, small, _CMP_LT_OQ)) {
      w = _mm512_div_ps(e, total);
    } else {
      const __m512 q0 = _mm512_mul_ps(e, y);
      w = _mm512_fmadd_ps(_mm512_fnmadd_ps(q0, total, e), y, q0);
    }
    _mm512_mask_storeu_ps(s + j, k, w);
  }
}

}  // namespace tandem::runtime::cpu
