// AVX2 + FMA + F16C kernels (this file alone is compiled with -mavx2 -mfma
// -mf16c; it is called only after the CPU says it has them).
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

template <DType D>
inline __m256 load8(const void* base, int64_t i) {
  if constexpr (D == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
  } else if constexpr (D == DType::kBF16) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
  }
}

template <DType D>
inline float load1(const void* base, int64_t i) {
  return load_as_f32(base, D, static_cast<std::size_t>(i));
}

// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))
inline float fold(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  return _mm_cvtss_f32(_mm_add_ss(a, _mm_shuffle_ps(a, a, 1)));
}

// One MR x NR tile of y: rows x[0..MR) against the W rows whose weights for
// k..k+7 start at w[n] + KS * k elements (KS = 1 row-major, 8 panels).
template <DType D, int MR, int NR, int KS>
inline void tile(const float* x, int64_t ldx, const uint8_t* const* w, int64_t K, float* y, int64_t ldy) {
  constexpr int64_t es = D == DType::kF32 ? 4 : 2;
  __m256 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t{7};
  for (int64_t k = 0; k < K8; k += 8) {
    // Streaming W from memory: ask for the lines ahead of each row (of the
    // panel, which is one stream, when the tile is a whole panel).
    if constexpr (MR == 1 && KS == 1) {
      if ((k * es) % 64 == 0)
        for (int n = 0; n < NR; ++n) _mm_prefetch(reinterpret_cast<const char*>(w[n] + k * es + 512), _MM_HINT_T0);
    } else if constexpr (MR == 1 && NR == 8) {
      for (int64_t b = 0; b < 8 * 8 * es; b += 64)
        _mm_prefetch(reinterpret_cast<const char*>(w[0] + KS * k * es + 1024 + b), _MM_HINT_T0);
    }
    __m256 wv[NR];
    for (int n = 0; n < NR; ++n) wv[n] = load8<D>(w[n], KS * k);
    for (int m = 0; m < MR; ++m) {
      const __m256 xv = _mm256_loadu_ps(x + m * ldx + k);
      for (int n = 0; n < NR; ++n) acc[m][n] = _mm256_fmadd_ps(xv, wv[n], acc[m][n]);
    }
  }
  for (int m = 0; m < MR; ++m) {
    for (int n = 0; n < NR; ++n) {
      float r = fold(acc[m][n]);
      for (int64_t k = K8; k < K; ++k) r = std::fma(x[m * ldx + k], load1<D>(w[n], k), r);  // row-major only
      y[m * ldy + n] = r;
    }
  }
}

// Where each W row's weights start, for tiles of up to eight rows.
struct RowStarts {
  const Matrix& W;
  int64_t es;
  const uint8_t* p[8];
  const uint8_t* const* at(int64_t n, int count) {
    const auto* base = static_cast<const uint8_t*>(W.data);
    for (int i = 0; i < count; ++i) p[i] = base + static_cast<int64_t>(W.index(n + i, 0)) * es;
    return p;
  }
};

// Rows are walked in cache blocks: a block of x rows stays in L2 while every
// W row of this call streams past it. Blocking changes no arithmetic.
template <DType D, int KS>
void matmul_t(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
              int64_t ldy) {
  const int64_t K = W.cols;
  const auto es = static_cast<int64_t>(dtype_size(D));
  RowStarts rs{W, es, {}};
  if (M < 4) {
    for (int64_t m = 0; m < M; ++m) {
      const float* xm = x + m * ldx;
      float* ym = y + m * ldy;
      int64_t n = n0;
      if constexpr (KS == 8) {
        for (; n < n1 && (n & 7); ++n) tile<D, 1, 1, KS>(xm, ldx, rs.at(n, 1), K, ym + n, ldy);
      }
      for (; n + 8 <= n1; n += 8) tile<D, 1, 8, KS>(xm, ldx, rs.at(n, 8), K, ym + n, ldy);
      for (; n + 4 <= n1; n += 4) tile<D, 1, 4, KS>(xm, ldx, rs.at(n, 4), K, ym + n, ldy);
      for (; n < n1; ++n) tile<D, 1, 1, KS>(xm, ldx, rs.at(n, 1), K, ym + n, ldy);
    }
    return;
  }
  const int64_t m_block = std::max<int64_t>(4, (int64_t{1} << 20) / (K * 4) / 4 * 4);  // ~1 MiB of x
  const int64_t n_block = std::max<int64_t>(3, (int64_t{256} << 10) / (K * es) / 3 * 3);
  for (int64_t mb = 0; mb < M; mb += m_block) {
    const int64_t me = std::min(M, mb + m_block);
    for (int64_t nb = n0; nb < n1; nb += n_block) {
      const int64_t ne = std::min(n1, nb + n_block);
      int64_t m = mb;
      for (; m + 4 <= me; m += 4) {
        int64_t n = nb;
        for (; n + 3 <= ne; n += 3) tile<D, 4, 3, KS>(x + m * ldx, ldx, rs.at(n, 3), K, y + m * ldy + n, ldy);
        for (; n < ne; ++n) tile<D, 4, 1, KS>(x + m * ldx, ldx, rs.at(n, 1), K, y + m * ldy + n, ldy);
      }
      for (; m < me; ++m) {
        int64_t n = nb;
        for (; n + 4 <= ne; n += 4) tile<D, 1, 4, KS>(x + m * ldx, ldx, rs.at(n, 4), K, y + m * ldy + n, ldy);
        for (; n < ne; ++n) tile<D, 1, 1, KS>(x + m * ldx, ldx, rs.at(n, 1), K, y + m * ldy + n, ldy);
      }
    }
  }
}

template <DType D>
void matmul_d(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.panels) matmul_t<D, 8>(x, ldx, M, W, n0, n1, y, ldy);
  else matmul_t<D, 1>(x, ldx, M, W, n0, n1, y, ldy);
}

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.quantized()) return matmul_dequantized(*avx2_kernels(), x, ldx, M, W, n0, n1, y, ldy);
  with_dtype(W.dtype, [&](auto d) { matmul_d<decltype(d)::value>(x, ldx, M, W, n0, n1, y, ldy); });
}

float dot(const float* a, const float* b, int64_t n) {
  float r;
  const auto* row = reinterpret_cast<const uint8_t*>(b);
  tile<DType::kF32, 1, 1, 1>(a, 0, &row, n, &r, 0);
  return r;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}

// Four rows at a time: four independent 8-lane chains, each exactly dot().
template <DType D>
void dot_rows_one(const float* q, const void* const* rows, int64_t count, int64_t n, float* out) {
  const int64_t n8 = n & ~int64_t{7};
  int64_t r = 0;
  for (; r + 4 <= count; r += 4) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const void *p0 = rows[r], *p1 = rows[r + 1], *p2 = rows[r + 2], *p3 = rows[r + 3];
    for (int64_t k = 0; k < n8; k += 8) {
      const __m256 qv = _mm256_loadu_ps(q + k);
      a0 = _mm256_fmadd_ps(qv, load8<D>(p0, k), a0);
      a1 = _mm256_fmadd_ps(qv, load8<D>(p1, k), a1);
      a2 = _mm256_fmadd_ps(qv, load8<D>(p2, k), a2);
      a3 = _mm256_fmadd_ps(qv, load8<D>(p3, k), a3);
    }
    float v[4] = {fold(a0), fold(a1), fold(a2), fold(a3)};
    const void* ps[4] = {p0, p1, p2, p3};
    for (int i = 0; i < 4; ++i) {
      for (int64_t k = n8; k < n; ++k) v[i] = std::fma(q[k], load1<D>(ps[i], k), v[i]);
      out[r + i] = v[i];
    }
  }
  for (; r < count; ++r) {
    const auto* row = static_cast<const uint8_t*>(rows[r]);
    tile<D, 1, 1, 1>(q, 0, &row, n, out + r, 0);
  }
}

template <DType D>
void dot_rows_d(const float* q, int64_t ldq, int64_t M, const void* const* rows, int64_t count, int64_t n, float* out,
                int64_t ldo) {
  for (int64_t m = 0; m < M; ++m) dot_rows_one<D>(q + m * ldq, rows, count, n, out + m * ldo);
}

void dot_rows(const float* q, int64_t ldq, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
              float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3) return dot_rows_widened(*avx2_kernels(), q, ldq, M, rows, count, n, out, ldo);
  with_dtype(kv, [&](auto d) { dot_rows_d<decltype(d)::value>(q, ldq, M, rows, count, n, out, ldo); });
}

// Columns in chunks of 64 held in eight registers across every row.
template <DType D>
void weighted_sum_one(const float* w, const void* const* rows, int64_t count, int64_t n, bool accumulate, float* out) {
  constexpr int64_t es = D == DType::kF32 ? 4 : 2;
  int64_t c = 0;
  for (; c + 64 <= n; c += 64) {
    __m256 acc[8];
    for (int i = 0; i < 8; ++i) acc[i] = accumulate ? _mm256_loadu_ps(out + c + 8 * i) : _mm256_setzero_ps();
    for (int64_t r = 0; r < count; ++r) {
      const __m256 wv = _mm256_set1_ps(w[r]);
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(wv, load8<D>(rows[r], c + 8 * i), acc[i]);
    }
    for (int i = 0; i < 8; ++i) _mm256_storeu_ps(out + c + 8 * i, acc[i]);
  }
  if (!accumulate)
    for (int64_t i = c; i < n; ++i) out[i] = 0.0f;
  for (int64_t r = 0; r < count; ++r) {
    const __m256 av = _mm256_set1_ps(w[r]);
    const auto* row = static_cast<const uint8_t*>(rows[r]) + c * es;
    float* o = out + c;
    int64_t i = 0;
    for (; i + 8 <= n - c; i += 8) _mm256_storeu_ps(o + i, _mm256_fmadd_ps(av, load8<D>(row, i), _mm256_loadu_ps(o + i)));
    for (; i < n - c; ++i) o[i] = std::fma(w[r], load1<D>(row, i), o[i]);
  }
}

template <DType D>
void weighted_sum_d(const float* w, int64_t ldw, int64_t M, const void* const* rows, int64_t count, int64_t n,
                    bool accumulate, float* out, int64_t ldo) {
  for (int64_t m = 0; m < M; ++m) weighted_sum_one<D>(w + m * ldw, rows, count, n, accumulate, out + m * ldo);
}

void weighted_sum(const float* w, int64_t ldw, int64_t M, DType kv, const void* const* rows, int64_t count, int64_t n,
                  bool accumulate, float* out, int64_t ldo) {
  if (kv == DType::kF8E4M3)
    return weighted_sum_widened(*avx2_kernels(), w, ldw, M, rows, count, n, accumulate, out, ldo);
  with_dtype(kv, [&](auto d) { weighted_sum_d<decltype(d)::value>(w, ldw, M, rows, count, n, accumulate, out, ldo); });
}

void matmul_tree(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  matmul_tree_by_parts(*avx2_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
}

// kernels.h's exp_fixed, eight at a time; y x 2^n as (y x 2^(n - n')) x 2^n'
// with n' = max(n, -126): the first product exact, the second rounded once.
inline __m256 exp8(__m256 d) {
  const __m256 x = _mm256_max_ps(_mm256_set1_ps(-104.0f), d);  // a NaN d stays NaN
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(1.9875691500e-4f), r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i hi = _mm256_max_epi32(ni, _mm256_set1_epi32(-126));
  auto pow2 = [](__m256i k) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23)); };
  return _mm256_mul_ps(_mm256_mul_ps(y, pow2(_mm256_sub_epi32(ni, hi))), pow2(hi));
}

// kernels.h's softmax: lanes 0-7 of the sum in lo, 8-15 in hi; the last n % 16 scores as the scalar table does them.
void softmax(float* s, int64_t n, float scale) {
  const int64_t n16 = n & ~int64_t{15};
  const __m256 sc = _mm256_set1_ps(scale);
  float max = -INFINITY;
  __m256 maxv = _mm256_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n16; j += 8) {
    const __m256 x = _mm256_mul_ps(_mm256_loadu_ps(s + j), sc);
    _mm256_storeu_ps(s + j, x);
    maxv = _mm256_max_ps(x, maxv);
  }
  for (int64_t j = n16; j < n; ++j) {
    s[j] *= scale;
    max = s[j] > max ? s[j] : max;
  }
  alignas(32) float l[16];
  _mm256_store_ps(l, maxv);
  for (int i = 0; i < 8; ++i) max = l[i] > max ? l[i] : max;
  const __m256 mx = _mm256_set1_ps(max);
  __m256 lo = _mm256_setzero_ps(), hi = lo;
  for (int64_t j = 0; j < n16; j += 16) {
    const __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), mx));
    const __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), mx));
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
    lo = _mm256_add_ps(lo, e0);
    hi = _mm256_add_ps(hi, e1);
  }
  _mm256_store_ps(l, lo);
  _mm256_store_ps(l + 8, hi);
  for (int64_t j = n16; j < n; ++j) l[j % 16] += (s[j] = exp_fixed(s[j] - max));
  const __m256 h = _mm256_add_ps(_mm256_load_ps(l), _mm256_load_ps(l + 8));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  const float total = _mm_cvtss_f32(_mm_add_ss(q, _mm_shuffle_ps(q, q, 1)));
  const __m256 tv = _mm256_set1_ps(total);
  // e_j / total rounded once, as softmax_avx512 computes it: one division for the row, an FMA residual and an FMA
  // correction a vector (Markstein); a vector holding a weight near underflow, and a row with a NaN, divide.
  const bool finite = std::isfinite(total);
  const __m256 y = _mm256_set1_ps(1.0f / total), small = _mm256_set1_ps(total * 0x1p-96f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 e = _mm256_loadu_ps(s + j);
    __m256 w;
    if (!finite || _mm256_movemask_ps(_mm256_cmp_ps(e, small, _CMP_LT_OQ))) {
      w = _mm256_div_ps(e, tv);
    } else {
      const __m256 q0 = _mm256_mul_ps(e, y);
      w = _mm256_fmadd_ps(_mm256_fnmadd_ps(q0, tv, e), y, q0);
    }
    _mm256_storeu_ps(s + j, w);
  }
  for (; j < n; ++j) s[j] /= total;
}

}  // namespace

// kernels.h's SwiGLU, eight at a time; the last n % 8 as the scalar statement.
void swiglu_avx2(float* g, const float* u, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  const __m256 qnan = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fc00000));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(g + i);
    const __m256 e = exp8(_mm256_or_ps(x, sign));  // -|x|
    const __m256 ge = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ);
    const __m256 s = _mm256_div_ps(_mm256_blendv_ps(e, one, ge), _mm256_add_ps(one, e));
    const __m256 r = _mm256_mul_ps(_mm256_mul_ps(x, s), _mm256_loadu_ps(u + i));
    _mm256_storeu_ps(g + i, _mm256_blendv_ps(r, qnan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q)));
  }
  swiglu_scalar(g + i, u + i, n - i);
}

const KernelTable* avx2_kernels() {
  static const KernelTable t{"avx2", matmul, dot, axpy, dot_rows, weighted_sum, matmul_tree,
                             widen_fp8_row_scalar, softmax};
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok ? &t : nullptr;
}

}  // namespace tandem::runtime::cpu
