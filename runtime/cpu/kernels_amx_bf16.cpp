// The bf16 tile arithmetic (kernels.h, MatmulMode::kBf16Amx) in two tables:
// "amx-bf16", where Intel's AMX multiplies 16 x 32 bf16 of activations by
// 32 x 16 of weights into a 16 x 16 tile of float sums in one instruction
// (tdpbf16ps), and "avx512-bf16amx", the same arithmetic on AVX-512 FMAs,
// which the AMX table also runs for fewer than kAmxRows rows (decode). This
// file alone is compiled with -mavx512bf16 -mamx-tile -mamx-bf16; the AMX
// code runs only where CPUID says AMX-BF16 and Linux grants the tile state.
//
// tdpbf16ps, as measured (kernels.h states it; the tests hold both tables to
// it): for each output, the 16 even-k products of the instruction's 32 k are
// added in order into one float from +0, the 16 odd-k products into another,
// and their sum is added to the tile's value; inputs that are subnormal count
// as 0 and subnormal results are flushed. The FMA path does the same under
// MXCSR's FTZ and DAZ, set for its duration.
//
// Per call on AMX: x's rows rounded to bf16, padded to whole tiles; then for
// a group of column blocks (16 columns each), their weights rearranged once
// into the B tiles' layout (the two k of a pair side by side, a row of the
// tile per pair) and multiplied by every pair of row tiles, 32 k at a time,
// two column blocks at once (2 x 2 C tiles).
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/amx_tiles.h"
#include "runtime/cpu/bf16_panels.h"
#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

constexpr int kFmaRows = 4;  // rows an FMA tile keeps (3 accumulators each)

// MXCSR's flush-to-zero (results) and, with inputs = true, denormals-are-zero (inputs) while alive. 8-bit
// panels are read without DAZ: their FP8 codes pass through subnormal floats on the way (quantized_panel.h),
// and their bf16 values (vcvtne2ps2bf16) are never subnormal.
class FlushDenormals {
 public:
  explicit FlushDenormals(bool inputs) {
    asm volatile("stmxcsr %0" : "=m"(saved_));
    const unsigned flushed = saved_ | 0x8000u | (inputs ? 0x40u : 0u);
    asm volatile("ldmxcsr %0" : : "m"(flushed) : "memory");
  }
  ~FlushDenormals() { asm volatile("ldmxcsr %0" : : "m"(saved_) : "memory"); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_ = 0;
};

// Lanes [c0, c1) of a 16-column block: the columns a block stores.
inline __mmask16 columns(int c0, int c1) { return static_cast<__mmask16>(((1u << c1) - 1u) & ~((1u << c0) - 1u)); }

// A panel that is not there (past the columns asked for): zeros.
struct NoPanel {
  void load(int64_t, __m512i& lo, __m512i& hi) const { lo = hi = _mm512_setzero_si512(); }
};

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

// An FP8 panel whose 8 rows share each column block's scale (128 x 128 blocks, a tensor's scale): its
// k-groups as bf16 (what QuantizedPanelReader<kF8E4M3> gives) by table lookup. Per column block, the
// table holds bf16(code value x scale) for the 128 magnitudes, the product rounded once to float32 and
// then to bf16 as vcvtneps2bf16 does; a code with its sign bit set is the negated entry (both roundings
// are symmetric). 64 codes take two byte lookups (vpermt2b) and four shuffles, where the float path
// takes twenty-odd instructions: FP8 decode is bound by that work, not by memory.
struct Fp8TableReader {
  const uint8_t* codes;
  PanelScales s;
  __m512i low[2], high[2];  // the entries' low and high bytes, 64 a register

  Fp8TableReader(const Matrix& W, int64_t p) : codes(static_cast<const uint8_t*>(W.data) + W.index(p, 0)), s(W, p) {
    table();
  }
  // Whether every panel of W reads one scale per column block.
  static bool fits(const Matrix& W) {
    const Scales& g = W.scales;
    return W.dtype == DType::kF8E4M3 && ((g.block_rows % 8 == 0 && g.r0 % 8 == 0) || g.r0 + W.rows <= g.block_rows);
  }
  // The 128 magnitudes' values, once: exact floats (E4M3's subnormals are normal floats).
  static const float* magnitudes() {
    alignas(64) static const auto values = [] {
      std::array<float, 128> v{};
      for (int c = 0; c < 128; ++c) v[static_cast<std::size_t>(c)] = f8e4m3_to_f32(static_cast<uint8_t>(c));
      return v;
    }();
    return values.data();
  }
  // Rebuilt at every column block (8 x 128 weights of a 128 x 128-block checkpoint): in registers.
  void table() {
    const float* m = magnitudes();
    const __m512 scale = _mm512_set1_ps(s.at(0));
    for (int i = 0; i < 2; ++i) {  // entries 64 i .. 64 i + 63
      __m256i lo[2], hi[2];
      for (int j = 0; j < 2; ++j) {
        const float* v = m + 64 * i + 32 * j;  // one rounding each, then to bf16
        const __m512i words = _mm512_inserti64x4(
            _mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(v), scale))),
            (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_load_ps(v + 16), scale)), 1);
        lo[j] = _mm512_cvtepi16_epi8(words);
        hi[j] = _mm512_cvtepi16_epi8(_mm512_srli_epi16(words, 8));
      }
      low[i] = _mm512_inserti64x4(_mm512_castsi256_si512(lo[0]), lo[1], 1);
      high[i] = _mm512_inserti64x4(_mm512_castsi256_si512(hi[0]), hi[1], 1);
    }
  }
  // k-group k's 64 entries as their low bytes l and high bytes h, in the codes' order (row r, column j at 8r + j).
  __attribute__((always_inline)) inline void lookup(int64_t k, __m512i& l, __m512i& h) {
    if (k >= s.next) {
      s.advance();
      table();
    }
    _mm_prefetch(reinterpret_cast<const char*>(codes + 8 * k + 1024), _MM_HINT_T0);  // one stream, fetched ahead
    const __m512i c = _mm512_loadu_si512(codes + 8 * k);
    l = _mm512_permutex2var_epi8(low[0], c, low[1]);  // bit 7 (the sign) not an index bit
    h = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(high[0], c, high[1]), c,
                                  _mm512_set1_epi8(static_cast<char>(0x80)), 0xF8);  // | sign
  }
  __attribute__((always_inline)) inline void load(int64_t k, __m512i& out_lo, __m512i& out_hi) {
    __m512i l, h;
    lookup(k, l, h);
    // unpack works per 128-bit lane: a = codes 0-7, 16-23, 32-39, 48-55 as words, b = 8-15, 24-31, ...
    const __m512i a = _mm512_unpacklo_epi8(l, h), b = _mm512_unpackhi_epi8(l, h);
    out_lo = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), b);
    out_hi = _mm512_permutex2var_epi64(a, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), b);
  }
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

// Two panels (the second may be absent: zeros) in the B tiles' layout: row p
// holds the 16 columns' pair (w[2p], w[2p + 1]), 64 bytes; Kp / 2 rows, those
// past K zeros.
// k-group k of two panels into the four B-tile rows of its pairs, at row (32 bf16 a row).
template <class A, class B>
inline void pack_group(A& a, B& b, int64_t k, uint16_t* row) {
  const __m512i pairs01 = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 1, 5, 9, 13, 17, 21, 25, 29);
  const __m512i pairs23 = _mm512_setr_epi32(2, 6, 10, 14, 18, 22, 26, 30, 3, 7, 11, 15, 19, 23, 27, 31);
  __m512i alo, ahi, blo, bhi;
  a.load(k, alo, ahi);
  b.load(k, blo, bhi);
  const __m512i a01 = _mm512_permutex2var_epi32(alo, pairs01, ahi), a23 = _mm512_permutex2var_epi32(alo, pairs23, ahi);
  const __m512i b01 = _mm512_permutex2var_epi32(blo, pairs01, bhi), b23 = _mm512_permutex2var_epi32(blo, pairs23, bhi);
  _mm512_storeu_si512(row, _mm512_shuffle_i64x2(a01, b01, _MM_SHUFFLE(1, 0, 1, 0)));
  _mm512_storeu_si512(row + 32, _mm512_shuffle_i64x2(a01, b01, _MM_SHUFFLE(3, 2, 3, 2)));
  _mm512_storeu_si512(row + 64, _mm512_shuffle_i64x2(a23, b23, _MM_SHUFFLE(1, 0, 1, 0)));
  _mm512_storeu_si512(row + 96, _mm512_shuffle_i64x2(a23, b23, _MM_SHUFFLE(3, 2, 3, 2)));
}

// The same from FP8 table readers (the second may be absent), the looked-up bytes gathered straight into the
// B rows: row 2r + h's half for one panel is bytes (low, high) of (column c, k 2(2r + h)) then of k + 1,
// c = 0..7, one vpermt2b per two rows: 12 shuffles for 128 weights where the readers' panel layout and
// pack_group take 20.
template <class B>
inline void pack_group(Fp8TableReader& a, B& b, int64_t k, uint16_t* row) {
  alignas(64) static const auto index = [] {
    std::array<std::array<uint8_t, 64>, 2> t{};
    for (int r = 0; r < 2; ++r)
      for (int h = 0; h < 2; ++h)
        for (int c = 0; c < 8; ++c)
          for (int e = 0; e < 2; ++e)
            for (int w = 0; w < 2; ++w)
              t[static_cast<std::size_t>(r)][static_cast<std::size_t>(32 * h + 4 * c + 2 * e + w)] =
                  static_cast<uint8_t>(64 * w + 8 * c + 2 * (2 * r + h) + e);
    return t;
  }();
  __m512i la, ha, lb = _mm512_setzero_si512(), hb = _mm512_setzero_si512();
  a.lookup(k, la, ha);
  if constexpr (std::is_same_v<B, Fp8TableReader>) b.lookup(k, lb, hb);
  for (int r = 0; r < 2; ++r) {
    const __m512i i = _mm512_load_si512(index[static_cast<std::size_t>(r)].data());
    const __m512i pa = _mm512_permutex2var_epi8(la, i, ha), pb = _mm512_permutex2var_epi8(lb, i, hb);
    _mm512_storeu_si512(row + 64 * r, _mm512_shuffle_i64x2(pa, pb, _MM_SHUFFLE(1, 0, 1, 0)));
    _mm512_storeu_si512(row + 64 * r + 32, _mm512_shuffle_i64x2(pa, pb, _MM_SHUFFLE(3, 2, 3, 2)));
  }
}

template <class A, class B>
void pack_b(A& a, B& b, int64_t K, int64_t Kp, uint16_t* out) {
  for (int64_t k = 0; k < K; k += 8) pack_group(a, b, k, out + 16 * k);  // pair k / 2
  std::memset(out + 16 * K, 0, static_cast<std::size_t>(16 * (Kp - K)) * 2);
}

// The 32 k from k (kk of them before K) of two panels as one B tile (16 rows of pairs), past K zeros.
template <class A, class B>
inline void pack_slab(A& a, B& b, int64_t k, int64_t kk, uint16_t* out) {
  for (int64_t i = 0; i < kk; i += 8) pack_group(a, b, k + i, out + 16 * i);
  if (kk < 32) std::memset(out + 16 * kk, 0, static_cast<std::size_t>(16 * (32 - kk)) * 2);
}

// One column block: its packed B and the columns it stores ([c0, c1) of 16; c0 == c1: none).
struct ColumnBlock {
  const uint16_t* b;
  int c0, c1;
};

// x's rows rounded to bf16 (as rows_as_bf16) in the A tiles' layout at out: 16 rows by 32 k a tile of 1 KiB
// (row m's 32 k at 32 m), a block of 16 rows' tiles in k order; k past K and rows past M (up to `rows`) zeros.
// A tile loads from one contiguous KiB: rows of x at a stride of 2-6 KiB fell on two L1 sets (one at 4 KiB)
// and a tile load missed its own rows.
void rows_as_bf16_tiles(const float* x, int64_t ldx, int64_t M, int64_t K, int64_t Kp, int64_t rows, uint16_t* out) {
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

// 16 columns of W from p (a second panel only below n1) in the B tiles' layout at out, Kp / 2 rows of pairs.
template <class Reader>
void pack_block(const Matrix& W, int64_t p, int64_t n1, int64_t Kp, uint16_t* out) {
  Reader a(W, p);
  if (p + 8 < n1) {
    Reader second(W, p + 8);
    pack_b(a, second, W.cols, Kp, out);
  } else {
    NoPanel none;
    pack_b(a, none, W.cols, Kp, out);
  }
}
using PackBlock = void (*)(const Matrix& W, int64_t p, int64_t n1, int64_t Kp, uint16_t* out);

// One part of a product on the tiles: its rows of x in tiles (rows_as_bf16_tiles), its 32-k steps, and where
// its weights sit in a packed column block.
struct TilePart {
  const uint16_t* xb;
  int64_t steps;
  int64_t offset;
};

constexpr int kTreeLevels = 8;  // partials on a tree's stack: up to kTileParts parts
constexpr int kTileParts = 1 << (kTreeLevels - 1);

// Row tiles 2 t and 2 t + 1 against two column blocks (C tiles 0-3, 2 x 2 of 16 x 16; A in 4-5, B in 6-7), for
// each part in turn from +0, the parts' sums added in matmul_tree_by_parts' tree (a part's 32 x 32 sums pushed,
// the top two added while they are of one level), the rows below M and the blocks' columns stored into y.
void tile_tree(const TilePart* parts, int count, int64_t t, int64_t M, const ColumnBlock& b0, const ColumnBlock& b1,
               float* y, int64_t ldy) {
  alignas(64) float slot[kTreeLevels][4][16 * 16];
  int level[kTreeLevels];
  int depth = 0;
  for (int c = 0; c < count; ++c) {
    const TilePart& part = parts[c];
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint16_t* a0 = part.xb + 2 * t * part.steps * 512;
    const uint16_t* a1 = a0 + part.steps * 512;
    const uint16_t* w0 = b0.b + part.offset;
    const uint16_t* w1 = b1.b + part.offset;
    for (int64_t s = 0; s < part.steps; ++s) {
      _tile_loadd(4, a0 + 512 * s, 64);
      _tile_loadd(6, w0 + 512 * s, 64);
      _tile_loadd(5, a1 + 512 * s, 64);
      _tile_loadd(7, w1 + 512 * s, 64);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    float(&top)[4][256] = slot[depth];
    _tile_stored(0, top[0], 64);
    _tile_stored(1, top[1], 64);
    _tile_stored(2, top[2], 64);
    _tile_stored(3, top[3], 64);
    level[depth++] = 0;
    while (depth >= 2 && level[depth - 1] == level[depth - 2]) {
      float* left = slot[depth - 2][0];
      const float* right = slot[depth - 1][0];
      for (int i = 0; i < 4 * 256; i += 16)
        _mm512_store_ps(left + i, _mm512_add_ps(_mm512_load_ps(left + i), _mm512_load_ps(right + i)));
      --depth;
      ++level[depth - 1];
    }
  }
  const ColumnBlock* cb[2] = {&b0, &b1};
  for (int i = 0; i < 2; ++i) {  // rows 32 t + 16 i on
    const int64_t m0 = t * 32 + 16 * i;
    if (m0 >= M) break;
    const int64_t rows = std::min<int64_t>(16, M - m0);
    for (int j = 0; j < 2; ++j) {
      const __mmask16 mask = columns(cb[j]->c0, cb[j]->c1);
      for (int64_t m = 0; m < rows; ++m)
        _mm512_mask_storeu_ps(y + (m0 + m) * ldy + 16 * j, mask, _mm512_load_ps(slot[0][2 * i + j] + 16 * m));
    }
  }
}

// More than 16 rows: y = the tree over parts c (count a power of two, at most kTileParts; one part: its product) of x's columns for
// part c (following part c - 1's) times parts[c], packs[c] rearranging its weights. x's rows rounded to bf16 in
// tiles, part by part; then for a group of column blocks (16 columns each, all the parts' k), their weights
// rearranged once into the B tiles' layout (~512 KiB) and multiplied by every pair of row tiles, two column blocks
// at once. A row-parallel product's partials never leave L1 (matmul_tree_by_parts wrote each part's M x N to
// memory and added them there).
void tiles_block(const float* x, int64_t ldx, int64_t M, const Matrix* parts, const PackBlock* packs, int count,
                 int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t pairs = (M + 31) / 32;
  thread_local LineVector<uint16_t> xb, packed;
  thread_local std::vector<TilePart> tp;
  tp.resize(static_cast<std::size_t>(count));
  int64_t rows_elems = 0, block_elems = 0;  // all parts' tiled x; one column block of all parts
  for (int c = 0; c < count; ++c) {
    const int64_t Kp = (parts[c].cols + 31) / 32 * 32;
    tp[static_cast<std::size_t>(c)] = {nullptr, Kp / 32, block_elems};
    rows_elems += pairs * 32 * Kp;
    block_elems += 16 * Kp;
  }
  xb.resize(static_cast<std::size_t>(rows_elems));
  int64_t k0 = 0, at = 0;
  for (int c = 0; c < count; ++c) {
    TilePart& part = tp[static_cast<std::size_t>(c)];
    rows_as_bf16_tiles(x + k0, ldx, M, parts[c].cols, 32 * part.steps, pairs * 32, xb.data() + at);
    part.xb = xb.data() + at;
    k0 += parts[c].cols;
    at += pairs * 32 * 32 * part.steps;
  }
  // A group's weights and the row tiles' bf16 rows stay in L2 between uses.
  const int64_t block_bytes = 2 * block_elems, group = std::max<int64_t>(2, (int64_t{1} << 19) / block_bytes / 2 * 2);
  thread_local std::vector<ColumnBlock> blocks;
  packed.resize(static_cast<std::size_t>(group * block_elems));
  configure_tiles();
  for (int64_t g = n0 / 8 * 8; g < n1; g += 16 * group) {
    blocks.clear();
    for (int64_t i = 0; i < group; ++i) {
      const int64_t p = g + 16 * i;
      uint16_t* b = packed.data() + i * block_elems;
      if (p >= n1) {  // past the range: zeros, nothing stored
        if (i % 2 == 0) break;
        std::memset(b, 0, static_cast<std::size_t>(block_bytes));
        blocks.push_back({b, 0, 0});
        continue;
      }
      for (int c = 0; c < count; ++c)
        packs[c](parts[c], p, n1, 32 * tp[static_cast<std::size_t>(c)].steps, b + tp[static_cast<std::size_t>(c)].offset);
      blocks.push_back(
          {b, static_cast<int>(std::max<int64_t>(n0, p) - p), static_cast<int>(std::min<int64_t>(n1, p + 16) - p)});
    }
    for (int64_t t = 0; t < pairs; ++t)
      for (std::size_t i = 0; i < blocks.size(); i += 2)
        tile_tree(tp.data(), count, t, M, blocks[i], blocks[i + 1], y + g + 16 * static_cast<int64_t>(i), ldy);
  }
  _tile_release();
  _mm256_zeroupper();  // GCC 12 puts none after AMX code (kernels_amx.cpp: the callers' SSE code ran 2-3x slower)
}

// tiles_block on blocks of rows whose bf16 copy (~1.5 MiB) stays in L2 beside a group of weights: each group is
// multiplied by the rows it was rearranged for, re-read from L2, not from L3 once per group; each block rearranges
// the weights again. (The bench model's 512-token prefill on a Xeon with 2 MiB of L2 a core, alternated runs:
// ~1.5 MiB 546 tok/s, 768 KiB 515, no blocks 540; row_parallel's 64 rows a call 494, 256 rows 523.)
void matmul_tiles(const float* x, int64_t ldx, int64_t M, const Matrix* parts, const PackBlock* packs, int count,
                  int64_t n0, int64_t n1, float* y, int64_t ldy) {
  int64_t k = 0;
  for (int c = 0; c < count; ++c) k += (parts[c].cols + 31) / 32 * 32;
  const int64_t block = std::max<int64_t>(32, (int64_t{1536} << 10) / (2 * k) / 32 * 32);
  const int64_t blocks = (M + block - 1) / block, rows = ((M + blocks - 1) / blocks + 31) / 32 * 32;  // even blocks
  for (int64_t r0 = 0; r0 < M; r0 += rows)
    tiles_block(x + r0 * ldx, ldx, std::min(rows, M - r0), parts, packs, count, n0, n1, y + r0 * ldy, ldy);
}

// Up to 16 rows (decode): one A tile of M rows; for each pair of column blocks, 32 k at a time, their B tiles
// rearranged into a 2 KiB slab (in L1) and multiplied at once, the weights streamed once.
template <class Reader>
void matmul_rows16(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  const int64_t K = W.cols, Kp = (K + 31) / 32 * 32;
  thread_local LineVector<uint16_t> xb;
  rows_as_bf16(x, ldx, M, K, xb, Kp, M);
  alignas(64) uint16_t slabs[2][2][16 * 32];  // two in turn: a step's rearranging never waits for the last tile loads
  alignas(64) float c[2][16 * 16];
  configure_tiles(static_cast<int>(M));
  for (int64_t p = n0 / 8 * 8; p < n1; p += 32) {
    _tile_zero(0);
    _tile_zero(1);
    const bool has[4] = {true, p + 8 < n1, p + 16 < n1, p + 24 < n1};
    Reader r[4] = {Reader(W, p), Reader(W, has[1] ? p + 8 : p), Reader(W, has[2] ? p + 16 : p),
                   Reader(W, has[3] ? p + 24 : p)};
    NoPanel none;
    for (int64_t k = 0; k < Kp; k += 32) {
      const int64_t kk = std::min<int64_t>(32, K - k);
      auto& slab = slabs[(k / 32) % 2];
      for (int j = 0; j < 2; ++j) {
        if (!has[2 * j]) continue;
        // pack_b on this slab's 32 k (kk of them real)
        if (has[2 * j + 1])
          pack_slab(r[2 * j], r[2 * j + 1], k, kk, slab[j]);
        else
          pack_slab(r[2 * j], none, k, kk, slab[j]);
      }
      _tile_loadd(4, xb.data() + k, Kp * 2);
      _tile_loadd(6, slab[0], 64);
      _tile_dpbf16ps(0, 4, 6);
      if (has[2]) {
        _tile_loadd(7, slab[1], 64);
        _tile_dpbf16ps(1, 4, 7);
      }
    }
    _tile_stored(0, c[0], 64);
    if (has[2]) _tile_stored(1, c[1], 64);
    for (int j = 0; j < 2 && has[2 * j]; ++j) {
      const int64_t first = p + 16 * j;
      const int c0 = static_cast<int>(std::max<int64_t>(n0, first) - first);
      const int c1 = static_cast<int>(std::min<int64_t>(n1, first + 16) - first);
      const __mmask16 mask = columns(c0, c1);
      for (int64_t m = 0; m < M; ++m) _mm512_mask_storeu_ps(y + m * ldy + first, mask, _mm512_load_ps(c[j] + 16 * m));
    }
  }
  _tile_release();
  _mm256_zeroupper();
}

// Calls f(std::type_identity<Reader>{}) with the reader of W's panels under this arithmetic (8-bit panels: their
// values rounded to bf16; bf16 panels as they are); false, calling nothing, for weights the f32 table takes.
template <class F>
bool with_reader(const Matrix& W, F&& f) {
  if (W.quantized() && quantized_panels_ok(W)) {
    static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
    if (vbmi && Fp8TableReader::fits(W))
      f(std::type_identity<Fp8TableReader>{});
    else if (W.dtype == DType::kF8E4M3)
      f(std::type_identity<QuantizedPanelReader<DType::kF8E4M3>>{});
    else
      f(std::type_identity<QuantizedPanelReader<DType::kI8>>{});
    return true;
  }
  if (!W.panels || W.dtype != DType::kBF16) return false;
  f(std::type_identity<Bf16PanelReader>{});
  return true;
}

template <bool kTiles>
void matmul_bf16amx(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                    int64_t ldy) {
  const bool ours = with_reader(W, [&](auto r) {
    using Reader = typename decltype(r)::type;
    if (kTiles && M > 16) {
      const PackBlock pack = pack_block<Reader>;
      matmul_tiles(x, ldx, M, &W, &pack, 1, n0, n1, y, ldy);
    } else if (kTiles) {
      matmul_rows16<Reader>(x, ldx, M, W, n0, n1, y, ldy);
    } else {
      matmul_fma<Reader>(x, ldx, M, W, n0, n1, y, ldy);
    }
  });
  if (!ours) avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);  // kF32's
}

template <bool kTiles>
void matmul_tree_bf16amx(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                         float* y, int64_t ldy) {
  thread_local std::vector<PackBlock> packs;
  packs.assign(static_cast<std::size_t>(count), nullptr);
  for (int c = 0; c < count; ++c)  // each part's product as matmul makes it, added in the tree
    if (!with_reader(parts[c], [&](auto r) { packs[static_cast<std::size_t>(c)] = pack_block<typename decltype(r)::type>; }))
      return avx512_kernels()->matmul_tree(x, ldx, M, parts, count, n0, n1, y, ldy);  // kF32's
  if (kTiles && M > 16 && count <= kTileParts)
    return matmul_tiles(x, ldx, M, parts, packs.data(), count, n0, n1, y, ldy);
  const KernelTable& self = kTiles ? *amx_bf16_kernels() : *avx512_bf16amx_kernels();
  matmul_tree_by_parts(self, x, ldx, M, parts, count, n0, n1, y, ldy);
}

}  // namespace

const KernelTable* avx512_bf16amx_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_kernels();
    if (!base || !__builtin_cpu_supports("avx512bf16")) return nullptr;
    static const KernelTable t{
        "avx512-bf16amx",   matmul_bf16amx<false>,      base->dot,           base->axpy,   base->dot_rows,
        base->weighted_sum, matmul_tree_bf16amx<false>, base->widen_fp8_row, base->softmax};
    return &t;
  }();
  return table;
}

const KernelTable* amx_bf16_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_bf16amx_kernels();
    if (!base || !amx_usable(22)) return nullptr;  // AMX-BF16
    static const KernelTable t{
        "amx-bf16",         matmul_bf16amx<true>,      base->dot,           base->axpy,    base->dot_rows,
        base->weighted_sum, matmul_tree_bf16amx<true>, base->widen_fp8_row, base->softmax, 1024};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
