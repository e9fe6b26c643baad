// The panel readers both bf16-amx tables share (kernels.h, MatmulMode::kBf16Amx): a panel that is not there, FP8
// panels through a bf16 table, and which reader a matrix takes. Included only by files compiled with -mavx512bf16
// -mavx512vbmi (kernels_avx512_bf16amx.cpp, kernels_amx_bf16.cpp), in an unnamed namespace: each includer has
// its own copy.
#pragma once

#include <immintrin.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "runtime/cpu/bf16_panels.h"
#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {
namespace {

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
    // one stream, fetched 16 KiB ahead (1 KiB: FP8 decode of one sequence 23 tok/s on the bench model, 16 KiB 27)
    _mm_prefetch(reinterpret_cast<const char*>(codes + 8 * k + 16384), _MM_HINT_T0);
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

}  // namespace
}  // namespace tandem::runtime::cpu
