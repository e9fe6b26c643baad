// FP8 weights in decode on GFNI: the AVX-512 table with its FP8 register
// tiles for one or two rows of x (a decode step of one sequence; a MoE
// expert's few tokens) rewritten around GF(2) affine instructions. This
// file alone is compiled with -mgfni; its table exists only after the CPU
// says it has GFNI (Ice Lake, Zen 4 and later), and computes exactly the
// AVX-512 table's bits (kernels.h).
//
// Why: a decode step reads each weight once, so its speed is the rate at
// which codes become floats. The AVX-512 table spends three integer
// instructions on 16 codes (sign extension, shift, mask); on a 2-core Zen 4
// that held FP8 decode to 13-16 GB/s a core in cache, below the memory's share.
// Here 64 codes (one k-group of a panel: 8 rows x 8 columns) take two affine
// byte maps and six unpacks: about 20 GB/s a core, INT8's rate. (Codes that
// are FP8 subnormals become f32 subnormals here as in QPanel, and Zen 4
// multiplies those slowly: random codes, 1 in 18 of them subnormal, run at
// 14 GB/s; the bench model quantized has 3 in 10^5.)
//
// The floats made are the same as QPanel's: value x 2^-120 exactly (the
// code's sign at bit 31, its exponent and mantissa at bits 26..20), times
// scale x 2^120, or times 2^120 then the scale where that would overflow:
// the one rounding of code x scale. What differs is where they sit: an
// unpack works within 128-bit lanes, so accumulator a[0] holds rows 0, 2, 4,
// 6 (quarter j: row 2j) at columns k..k+3 of each k-group, a[1] the same
// rows at k+4..k+7, a[2] and a[3] the odd rows. Each lane still adds, with
// FMA in increasing k, exactly the products of kernels.h's lane (column
// k mod 8 of its row), and the fold is kernels.h's
// ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)): a[0] + a[1] is (l0+l4, l1+l5,
// l2+l6, l3+l7) lane by lane. So every output is bitwise the AVX-512
// table's, at every batch size (kernels_test holds them to it).
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/quantized_panel.h"

namespace tandem::runtime::cpu {
namespace {

// Fewer rows of x than this come here. With more, a step is bound by its
// multiply-adds rather than by turning codes into floats, and the AVX-512
// table's tiles (one broadcast of x a k-group where these need two) win:
// measured on Zen 4 in cache, 19.7 against 15.3 GB/s of codes at 1 row, 13.8
// against 12.9 at 2, 11.4 against 11.7 at 3.
constexpr int64_t kRegisterRows = 3;

// GF(2) affine maps of a code's bits (gf2p8affineqb: output bit i is the
// parity of the code AND byte 7 - i of the matrix). High byte of the float:
// code bit 7 (sign) to bit 7, bits 6..4 (exponent's top three) to 2..0. Low
// byte: bits 3..0 (exponent's low bit, mantissa) to 7..4.
constexpr long long kHighByte = 0x1020400000000080LL;
constexpr long long kLowByte = 0x0000000001020408LL;

// One k-group of a panel (64 codes) as the floats' bits, in the lane order
// above: w[0] = even rows, columns 0-3; w[1] even, 4-7; w[2], w[3] odd.
struct Fp8Group {
  __m512i high = _mm512_set1_epi64(kHighByte), low = _mm512_set1_epi64(kLowByte), zero = _mm512_setzero_si512();

  __attribute__((always_inline)) inline void operator()(const uint8_t* group, __m512 (&w)[4]) const {
    const __m512i c = _mm512_loadu_si512(group);
    const __m512i lo = _mm512_gf2p8affine_epi64_epi8(c, low, 0), hi = _mm512_gf2p8affine_epi64_epi8(c, high, 0);
    const __m512i even = _mm512_unpacklo_epi8(lo, hi), odd = _mm512_unpackhi_epi8(lo, hi);  // floats' upper halves
    w[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, even));
    w[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, even));
    w[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, odd));
    w[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, odd));
  }
};

// Columns [k0, k1) of one column block: MR rows of x against the panel's
// codes, scales se (even rows, a row a quarter) and so (odd rows), already
// times 2^120 unless TwoStep.
template <int MR, bool TwoStep>
inline void block_products(const float* x, int64_t ldx, const uint8_t* codes, int64_t k0, int64_t k1, __m512 se,
                           __m512 so, __m512 (&acc)[MR][4]) {
  const Fp8Group widen;
  for (int64_t k = k0; k < k1; k += 8) {
    // one stream, 16 KiB ahead (1 KiB: FP8 decode 5% slower)
    _mm_prefetch(reinterpret_cast<const char*>(codes + 8 * k + 16384), _MM_HINT_T0);
    __m512 w[4];
    widen(codes + 8 * k, w);
    for (int i = 0; i < 4; ++i) {
      if constexpr (TwoStep) w[i] = _mm512_mul_ps(w[i], _mm512_set1_ps(0x1p120f));
      w[i] = _mm512_mul_ps(w[i], i < 2 ? se : so);
    }
    for (int m = 0; m < MR; ++m) {
      const __m512 xlo = _mm512_broadcast_f32x4(_mm_loadu_ps(x + m * ldx + k));
      const __m512 xhi = _mm512_broadcast_f32x4(_mm_loadu_ps(x + m * ldx + k + 4));
      acc[m][0] = _mm512_fmadd_ps(xlo, w[0], acc[m][0]);
      acc[m][1] = _mm512_fmadd_ps(xhi, w[1], acc[m][1]);
      acc[m][2] = _mm512_fmadd_ps(xlo, w[2], acc[m][2]);
      acc[m][3] = _mm512_fmadd_ps(xhi, w[3], acc[m][3]);
    }
  }
}

// A row's 8 outputs from its four accumulators, folded as kernels.h says.
inline __m256 fold_rows(const __m512 (&a)[4]) {
  const __m512 even = _mm512_add_ps(a[0], a[1]), odd = _mm512_add_ps(a[2], a[3]);  // l0+l4, l1+l5, l2+l6, l3+l7
  const __m512 e = _mm512_add_ps(even, _mm512_permute_ps(even, _MM_SHUFFLE(1, 0, 3, 2)));  // (..)+(..), twice
  const __m512 o = _mm512_add_ps(odd, _mm512_permute_ps(odd, _MM_SHUFFLE(1, 0, 3, 2)));
  const __m512 both = _mm512_shuffle_ps(e, o, _MM_SHUFFLE(1, 0, 1, 0));                   // quarter j: e0 e1 o0 o1
  const __m512 r = _mm512_add_ps(both, _mm512_permute_ps(both, _MM_SHUFFLE(2, 3, 0, 1)));  // rows 2j, 2j+1 at 0, 2
  return _mm512_castps512_ps256(
      _mm512_permutexvar_ps(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), r));
}

// MR rows of x against the FP8 panel at row n of W, stored.
template <int MR>
void fp8_tile(const float* x, int64_t ldx, const Matrix& W, int64_t n, float* y, int64_t ldy) {
  const auto* codes = static_cast<const uint8_t*>(W.data) + W.index(n, 0);
  PanelScales s(W, n);
  __m512 acc[MR][4];
  for (int m = 0; m < MR; ++m)
    for (int i = 0; i < 4; ++i) acc[m][i] = _mm512_setzero_ps();
  for (int64_t k0 = 0; k0 < W.cols; s.advance()) {
    const int64_t k1 = std::min(W.cols, s.next);
    const __m128 e = _mm_setr_ps(s.at(0), s.at(2), s.at(4), s.at(6));  // rows 0, 2, 4, 6: a quarter each
    const __m128 o = _mm_setr_ps(s.at(1), s.at(3), s.at(5), s.at(7));
    const __m512i quarter = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    __m512 se = _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(e));
    __m512 so = _mm512_permutexvar_ps(quarter, _mm512_castps128_ps512(o));
    const __m512 limit = _mm512_set1_ps(0x1p7f);  // x 2^120 would pass 2^127
    if ((_mm512_cmp_ps_mask(se, limit, _CMP_GE_OQ) | _mm512_cmp_ps_mask(so, limit, _CMP_GE_OQ)) != 0) {
      block_products<MR, true>(x, ldx, codes, k0, k1, se, so, acc);
    } else {
      se = _mm512_mul_ps(se, _mm512_set1_ps(0x1p120f));
      so = _mm512_mul_ps(so, _mm512_set1_ps(0x1p120f));
      block_products<MR, false>(x, ldx, codes, k0, k1, se, so, acc);
    }
    k0 = k1;
  }
  for (int m = 0; m < MR; ++m) _mm256_storeu_ps(y + m * ldy, fold_rows(acc[m]));
}

const KernelTable* table();

void matmul(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y, int64_t ldy) {
  if (W.dtype != DType::kF8E4M3 || M < 1 || M >= kRegisterRows || !quantized_panels_ok(W))
    return avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);
  const int64_t t0 = std::min(n1, (n0 + 7) / 8 * 8);
  const int64_t t1 = std::max(t0, n1 / 8 * 8);
  for (int64_t n = t0; n < t1; n += 8) {
    if (M == 1) fp8_tile<1>(x, ldx, W, n, y + n, ldy);
    else fp8_tile<2>(x, ldx, W, n, y + n, ldy);
  }
  if (n0 < t0) matmul_dequantized(*table(), x, ldx, M, W, n0, t0, y, ldy);
  if (t1 < n1) matmul_dequantized(*table(), x, ldx, M, W, t1, n1, y, ldy);
}

// 8-bit parts go through this table's matmul, part by part, in the tree (as the AVX-512 table's do).
void matmul_tree(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  if (count > 0 && parts[0].quantized()) return matmul_tree_by_parts(*table(), x, ldx, M, parts, count, n0, n1, y, ldy);
  avx512_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);
}

const KernelTable* table() {
  static const KernelTable* t = []() -> const KernelTable* {
    const KernelTable* base = avx512_kernels();
    if (!base || !__builtin_cpu_supports("gfni")) return nullptr;
    static const KernelTable k{"avx512-gfni", matmul, base->dot, base->axpy, base->dot_rows, base->weighted_sum,
                               matmul_tree, base->widen_fp8_row, base->softmax};
    return &k;
  }();
  return t;
}

}  // namespace

const KernelTable* avx512_gfni_kernels() { return table(); }

}  // namespace tandem::runtime::cpu
