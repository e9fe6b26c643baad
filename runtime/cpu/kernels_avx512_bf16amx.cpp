// The bf16 tile arithmetic (kernels.h, MatmulMode::kBf16Amx) on AVX-512 FMAs: the "avx512-bf16amx" table, for
// any CPU with AVX512-BF16 and AVX512-VBMI (the same bits as AMX's tiles, kernels_amx_bf16.cpp; Zen 4 nodes give
// what Sapphire Rapids nodes give). This file alone is compiled with -mavx512bf16 -mavx512vbmi, so the table needs
// both (Cooper Lake, BF16 without VBMI, has neither table).
//
// tdpbf16ps, as measured (kernels.h states it; the tests hold both tables to
// it): for each output, the 16 even-k products of the instruction's 32 k are
// added in order into one float from +0, the 16 odd-k products into another,
// and their sum is added to the tile's value; inputs that are subnormal count
// as 0 and subnormal results are flushed. The FMA path does the same under
// MXCSR's FTZ and DAZ, set for its duration.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/bf16amx_panels.h"
#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int kFmaRows = 4;  // rows an FMA tile keeps (3 accumulators each)

// Two panels' k-group (a: columns 0-7, b: 8-15, each as its reader gives it:
// lo = columns 0-3, hi = 4-7, a column's 8 k side by side) as 8 vectors of
// float: v[i] holds w[k + i] of the 16 columns, a bf16 exactly widened.
class KMajor {
 public:
  KMajor() {
    alignas(64) int16_t first[2][32], second[4][32];
    for (int kk = 0; kk < 4; ++kk) {
      for (int c = 0; c < 8; ++c) {  // [k 0..3 or 4..7][column 0..7] from the panel's [column][k]
        first[0][8 * kk + c] = static_cast<int16_t>(8 * c + kk);
        first[1][8 * kk + c] = static_cast<int16_t>(8 * c + kk + 4);
      }
      for (int c = 0; c < 16; ++c) {  // column c's bf16 at k kk into the upper half of dword c
        second[kk][2 * c] = 0;
        second[kk][2 * c + 1] = static_cast<int16_t>(c < 8 ? 8 * kk + c : 32 + 8 * kk + c - 8);
      }
    }
    for (int i = 0; i < 2; ++i) first_[i] = _mm512_load_si512(first[i]);
    for (int i = 0; i < 4; ++i) second_[i] = _mm512_load_si512(second[i]);
  }
  void operator()(__m512i alo, __m512i ahi, __m512i blo, __m512i bhi, __m512 (&v)[8]) const {
    const __m512i a0 = _mm512_permutex2var_epi16(alo, first_[0], ahi),
                  a1 = _mm512_permutex2var_epi16(alo, first_[1], ahi);
    const __m512i b0 = _mm512_permutex2var_epi16(blo, first_[0], bhi),
                  b1 = _mm512_permutex2var_epi16(blo, first_[1], bhi);
    constexpr __mmask32 kUpper = 0xAAAAAAAAu;
    for (int kk = 0; kk < 4; ++kk) {
      v[kk] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(kUpper, a0, second_[kk], b0));
      v[kk + 4] = _mm512_castsi512_ps(_mm512_maskz_permutex2var_epi16(kUpper, a1, second_[kk], b1));
    }
  }

 private:
  __m512i first_[2], second_[4];
};

// x's rows rounded to bf16 (rows_as_bf16), as floats: row m at out + m * K.
const float* rows_as_bf16_floats(const float* x, int64_t ldx, int64_t M, int64_t K, LineVector<uint16_t>& tmp,
                                 std::vector<float>& out) {
  const uint16_t* h = rows_as_bf16(x, ldx, M, K, tmp);
  out.resize(static_cast<std::size_t>(M * K));
  int64_t i = 0;
  for (; i + 16 <= M * K; i += 16)
    _mm512_storeu_ps(out.data() + i,
                     _mm512_castsi512_ps(_mm512_slli_epi32(
                         _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h + i))), 16)));
  for (; i < M * K; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(&out[static_cast<std::size_t>(i)], &bits, 4);
  }
  return out.data();
}

// MR rows of x (bf16 values as floats) against 16 columns, the rule in
// registers: per block of 32 k, E and O from +0, t += E + O.
template <int MR, class A, class B>
void fma_tile(const float* x, int64_t ldx, A& a, B& b, int64_t K, const KMajor& km, float* y, int64_t ldy, int c0,
              int c1) {
  __m512 t[MR], e[MR], o[MR];
  for (int m = 0; m < MR; ++m) t[m] = _mm512_setzero_ps();
  for (int64_t kb = 0; kb < K; kb += 32) {
    for (int m = 0; m < MR; ++m) e[m] = o[m] = _mm512_setzero_ps();
    const int64_t ke = std::min<int64_t>(K, kb + 32);
    for (int64_t k = kb; k < ke; k += 8) {
      __m512i alo, ahi, blo, bhi;
      a.load(k, alo, ahi);
      b.load(k, blo, bhi);
      __m512 v[8];
      km(alo, ahi, blo, bhi, v);
      for (int m = 0; m < MR; ++m) {
        const float* xm = x + m * ldx + k;
        for (int i = 0; i < 8; i += 2) {
          e[m] = _mm512_fmadd_ps(_mm512_set1_ps(xm[i]), v[i], e[m]);
          o[m] = _mm512_fmadd_ps(_mm512_set1_ps(xm[i + 1]), v[i + 1], o[m]);
        }
      }
    }
    if (ke - kb < 32) {  // the block's padding: products +0 (-0 + +0 is +0)
      for (int m = 0; m < MR; ++m) {
        e[m] = _mm512_add_ps(e[m], _mm512_setzero_ps());
        o[m] = _mm512_add_ps(o[m], _mm512_setzero_ps());
      }
    }
    for (int m = 0; m < MR; ++m) t[m] = _mm512_add_ps(t[m], _mm512_add_ps(e[m], o[m]));
  }
  const __mmask16 mask = columns(c0, c1);
  for (int m = 0; m < MR; ++m) _mm512_mask_storeu_ps(y + m * ldy, mask, t[m]);
}

template <class A, class B>
void fma_rows(int64_t mr, const float* x, int64_t ldx, A& a, B& b, int64_t K, const KMajor& km, float* y, int64_t ldy,
              int c0, int c1) {
  switch (mr) {
    case 4: return fma_tile<4>(x, ldx, a, b, K, km, y, ldy, c0, c1);
    case 3: return fma_tile<3>(x, ldx, a, b, K, km, y, ldy, c0, c1);
    case 2: return fma_tile<2>(x, ldx, a, b, K, km, y, ldy, c0, c1);
    default: return fma_tile<1>(x, ldx, a, b, K, km, y, ldy, c0, c1);
  }
}

// Columns [n0, n1) in blocks of 16 (two panels; a second past n1 absent),
// every column of a block computed, [n0, n1) stored.
template <class Block>
void for_blocks(int64_t n0, int64_t n1, const Block& block) {
  for (int64_t p = n0 / 8 * 8; p < n1; p += 16) {
    const int c0 = static_cast<int>(std::max<int64_t>(n0, p) - p);
    const int c1 = static_cast<int>(std::min<int64_t>(n1, p + 16) - p);
    block(p, p + 8 < n1, c0, c1);
  }
}

template <class Reader>
void matmul_fma(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                int64_t ldy) {
  const int64_t K = W.cols;
  thread_local LineVector<uint16_t> tmp;
  thread_local std::vector<float> xf;
  const float* xr = rows_as_bf16_floats(x, ldx, M, K, tmp, xf);
  const KMajor km;
  const FlushDenormals flush(std::is_same_v<Reader, Bf16PanelReader>);
  for_blocks(n0, n1, [&](int64_t p, bool two, int c0, int c1) {
    for (int64_t m = 0; m < M; m += kFmaRows) {
      const int64_t mr = std::min<int64_t>(kFmaRows, M - m);
      Reader a(W, p);
      if (two) {
        Reader b(W, p + 8);
        fma_rows(mr, xr + m * K, K, a, b, K, km, y + m * ldy + p, ldy, c0, c1);
      } else {
        NoPanel b;
        fma_rows(mr, xr + m * K, K, a, b, K, km, y + m * ldy + p, ldy, c0, c1);
      }
    }
  });
}

void matmul_fma_table(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                      int64_t ldy) {
  const bool ours =
      with_reader(W, [&](auto r) { matmul_fma<typename decltype(r)::type>(x, ldx, M, W, n0, n1, y, ldy); });
  if (!ours) avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);  // kF32's
}

void matmul_tree_fma_table(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0,
                           int64_t n1, float* y, int64_t ldy) {
  for (int c = 0; c < count; ++c)  // each part's product as matmul makes it, added in the tree
    if (!with_reader(parts[c], [](auto) {}))
      return avx512_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);  // kF32's
  matmul_tree_by_parts(*avx512_bf16amx_kernels(), x, ldx, M, parts, count, n0, n1, y, ldy);
}

}  // namespace

const KernelTable* avx512_bf16amx_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_kernels();
    if (!base || !__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512vbmi")) return nullptr;
    static const KernelTable t{
        "avx512-bf16amx",   matmul_fma_table,      base->dot,           base->axpy,   base->dot_rows,
        base->weighted_sum, matmul_tree_fma_table, base->widen_fp8_row, base->softmax, 64,
        attend_bf16amx_fma};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
