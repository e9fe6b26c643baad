// Attention in kBf16Amx's arithmetic (kernels.h: KernelTable::attend): on AMX-BF16 tiles (the "amx-bf16"
// table) and, for CPUs with AVX512-BF16 but no AMX, the same steps with each tdpbf16ps done on FMAs as
// kernels_avx512_bf16amx.cpp does it (the same bits). Compiled with -mavx512bf16 -mavx512vbmi -mamx-tile
// -mamx-bf16; the tile code runs only through the amx-bf16 table.
//
// A task's keys and values are first rounded to bf16 rows (a KV row of every kind: kv_row_as_bf16); then
//   scores: the keys rearranged once into B tiles (16 keys by 32 of head_dim a tile, a 16 x 16 transpose of
//     pairs each) and each 16 queries' rows, as A tiles, multiplied by them; on AMX with one tile of queries
//     (decode), the keys' rows are the A tiles as they are, the queries the B tiles, and the 16 x 16 sums
//     transposed back: no rearranging of the keys, which a decode step reads once;
//   the softmax of kernels.h on each query's scores, the weights outside its positions 0;
//   output: the weights as A tiles (32 positions a tile) times the values in B tiles (a pair of positions a
//     row, 16 of head_dim a tile), from the first block of 32 any of the 16 queries sees.
// Every element is one tdpbf16ps sum in kernels.h's order, whichever of the paths computed it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/amx_tiles.h"
#include "runtime/cpu/bf16_panels.h"
#include "runtime/cpu/bf16amx_panels.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/line_aligned.h"

namespace tandem::runtime::cpu {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// A KV row's n values (of type kv; FP8: as widen_fp8_row gives them) rounded to bf16, zeros on to np; a row
// that is not there (nullptr): zeros.
void kv_row_as_bf16(DType kv, const void* row, int64_t n, int64_t np, uint16_t* dst) {
  if (!row) {
    std::memset(dst, 0, static_cast<std::size_t>(np) * 2);
    return;
  }
  switch (kv) {
    case DType::kF32: return floats_as_bf16(static_cast<const float*>(row), n, np, dst);
    case DType::kBF16:
      std::memcpy(dst, row, static_cast<std::size_t>(n) * 2);
      std::memset(dst + n, 0, static_cast<std::size_t>(np - n) * 2);
      return;
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      for (int64_t k = 0; k < n; k += 16) {
        const __mmask16 m = n - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - k)) - 1u);
        const __m512 f = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + k));
        _mm256_mask_storeu_epi16(dst + k, m, (__m256i)_mm512_cvtneps_pbh(f));
      }
      std::memset(dst + n, 0, static_cast<std::size_t>(np - n) * 2);
      return;
    }
    default: {  // FP8 E4M3 with its row scale
      thread_local LineVector<float> widened;
      widened.resize(static_cast<std::size_t>(n));
      avx512_kernels()->widen_fp8_row(static_cast<const uint8_t*>(row), n, widened.data());
      return floats_as_bf16(widened.data(), n, np, dst);
    }
  }
}

// One query line: `count` queries at q + i * ld (outputs at out + i * ld), query i at position pos0 + i * step.
struct Line {
  const float* q;
  float* out;
  int64_t ld, count, pos0, step;
};

// A task's query lines: one per head (its rows), or, with one row, the heads together (decode).
int64_t line_count(const AttendTask& t) { return t.rows == 1 ? 1 : t.heads; }
Line line(const AttendTask& t, int64_t j) {
  if (t.rows == 1) return {t.q, t.out, t.ldq_head, t.heads, t.pos0, 0};
  return {t.q + j * t.ldq_head, t.out + j * t.ldq_head, t.ldq_row, t.rows, t.pos0, 1};
}

int64_t first_seen(const AttendTask& t, int64_t pos) {
  return t.window > 0 ? std::max<int64_t>(0, pos - t.window + 1) : 0;
}

// The task's keys and values as bf16 rows from position base, row p at p * ld: rows positions (zeros past the
// last position), in buffers each thread keeps.
struct Bf16Rows {
  const uint16_t* k;
  const uint16_t* v;
  const int64_t* bad;  // bad[p]: value rows before p holding an infinity or a NaN
  int64_t ld;
  Bf16Rows(const AttendTask& t, int64_t rows, int64_t ld_) : ld(ld_) {
    thread_local LineVector<uint16_t> kb, vb;
    thread_local std::vector<int64_t> nonfinite;
    kb.resize(static_cast<std::size_t>(rows * ld));
    vb.resize(static_cast<std::size_t>(rows * ld));
    nonfinite.assign(static_cast<std::size_t>(rows + 1), 0);
    const int64_t count = t.pos0 + t.rows - t.base;
    for (int64_t p = 0; p < rows; ++p) {
      kv_row_as_bf16(t.kv, p < count ? t.keys[p] : nullptr, t.head_dim, ld, kb.data() + p * ld);
      kv_row_as_bf16(t.kv, p < count ? t.values[p] : nullptr, t.head_dim, ld, vb.data() + p * ld);
      nonfinite[static_cast<std::size_t>(p + 1)] = nonfinite[static_cast<std::size_t>(p)] + !finite(vb.data() + p * ld);
    }
    k = kb.data(), v = vb.data(), bad = nonfinite.data();
  }
  // Whether every value row in [a, b) is finite.
  bool finite_in(int64_t a, int64_t b) const { return bad[b] == bad[a]; }

 private:
  bool finite(const uint16_t* row) const {  // ld bf16 (a multiple of 32): none with an exponent of all ones
    __mmask32 any = 0;
    for (int64_t i = 0; i < ld; i += 32) {
      const __m512i e = _mm512_and_si512(_mm512_loadu_si512(row + i), _mm512_set1_epi16(0x7F80));
      any |= _mm512_cmpeq_epi16_mask(e, _mm512_set1_epi16(0x7F80));
    }
    return any == 0;
  }
};

// The softmax of a query's scores (s: positions from base), the weights outside [first, pos] 0 in [from, to).
void weights_of(const AttendTask& t, int64_t pos, float* s, int64_t from, int64_t to) {
  const int64_t f = first_seen(t, pos) - t.base, e = pos + 1 - t.base;
  softmax_avx512(s + f, e - f, t.scale);
  std::fill(s + from, s + f, 0.0f);
  std::fill(s + e, s + to, 0.0f);
}

// ---- On AMX tiles ----

// The 16 x 16 32-bit elements of r transposed in place (r[i] element j becomes r[j] element i).
inline void transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {  // r[i + c]'s lane L: column 4 L + c of rows i .. i + 3
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  __m512i o[16];
  for (int c = 0; c < 4; ++c) {  // lanes: the 4 x 4 of 128-bit blocks
    const __m512i x0 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88), x1 = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);
    const __m512i x2 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    const __m512i x3 = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
    o[c] = _mm512_shuffle_i32x4(x0, x2, 0x88);
    o[4 + c] = _mm512_shuffle_i32x4(x1, x3, 0x88);
    o[8 + c] = _mm512_shuffle_i32x4(x0, x2, 0xDD);
    o[12 + c] = _mm512_shuffle_i32x4(x1, x3, 0xDD);
  }
  for (int i = 0; i < 16; ++i) r[i] = o[i];
}

// 16 rows of bf16 at src (row i at src + i * ld), 32 of them from k, as one B tile at out: row p holds each
// row's pair (2p, 2p + 1): the rows become the tile's 16 columns.
inline void rows_as_b_tile(const uint16_t* src, int64_t ld, int64_t k, uint16_t* out) {
  __m512i r[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * ld + k);
  transpose16(r);
  for (int p = 0; p < 16; ++p) _mm512_storeu_si512(out + 32 * p, r[p]);
}

// The values from position 32 b on, 16 of head_dim from 16 d on, as one B tile at out: row p holds each
// column's pair (position 32 b + 2p, + 1). Positions outside [from, to) as zeros.
inline void values_as_b_tile(const Bf16Rows& r, int64_t b, int64_t d, uint16_t* out, int64_t from = 0,
                             int64_t to = INT64_MAX) {
  const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const auto row = [&](int64_t pos) {
    if (pos < from || pos >= to) return _mm512_setzero_si512();
    return _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.v + pos * r.ld + d)));
  };
  for (int p = 0; p < 16; ++p) {
    const __m512i a = row(32 * b + 2 * p), c = row(32 * b + 2 * p + 1);
    // per 128-bit lane: lo = columns 8L .. 8L + 3 of both, hi = 8L + 4 .. 8L + 7 (lanes 0-1 hold columns 0-15)
    const __m512i lo = _mm512_unpacklo_epi16(a, c), hi = _mm512_unpackhi_epi16(a, c);
    _mm512_storeu_si512(out + 32 * p, _mm512_permutex2var_epi64(lo, lo_idx, hi));
  }
}

// The tile steps on AMX: C tiles 0-3, A in tile 4, B in 6 and 7.
struct AmxTiles {
  void zero() {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  }
  // The A tile: 16 rows of 32 bf16, row i at a + i * ld.
  void load_a(const uint16_t* a, int64_t ld) { _tile_loadd(4, a, static_cast<long>(ld * 2)); }
  // C tile j += A x the B tile at b[j] (16 rows of 16 pairs), j < n.
  void dp(int n, const uint16_t* const (&b)[4]) {
    _tile_loadd(6, b[0], 64);
    _tile_dpbf16ps(0, 4, 6);
    if (n > 1) {
      _tile_loadd(7, b[1], 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if (n > 2) {
      _tile_loadd(6, b[2], 64);
      _tile_dpbf16ps(2, 4, 6);
    }
    if (n > 3) {
      _tile_loadd(7, b[3], 64);
      _tile_dpbf16ps(3, 4, 7);
    }
  }
  // C tiles j < n at dst + 16 j, rows ld floats apart.
  void store(int n, float* dst, int64_t ld) {
    const auto stride = static_cast<long>(ld * 4);
    _tile_stored(0, dst, stride);
    if (n > 1) _tile_stored(1, dst + 16, stride);
    if (n > 2) _tile_stored(2, dst + 32, stride);
    if (n > 3) _tile_stored(3, dst + 48, stride);
  }
};

// The same steps on FMAs for the first `rows` rows, in tdpbf16ps's order (kernels.h): per B tile, the even
// pairs' products into E from +0, the odd into O, then C + (E + O); subnormal inputs read as 0 and subnormal
// results flushed (MXCSR's DAZ and FTZ while it multiplies, not in the softmax between).
struct FmaTiles {
  int64_t rows = 16;
  alignas(64) float a[16][32];  // the A tile's rows < `rows` as floats (bf16 exactly widened)
  alignas(64) float c[4][16][16];

  void zero() { std::memset(c, 0, sizeof c); }
  void load_a(const uint16_t* p, int64_t ld) {
    for (int64_t m = 0; m < rows; ++m)
      for (int h = 0; h < 2; ++h) {
        const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + m * ld + 16 * h));
        _mm512_store_ps(a[m] + 16 * h, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16)));
      }
  }
  void dp(int n, const uint16_t* const (&b)[4]) {
    const FlushDenormals flush(true);
    const __m512i upper = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    for (int j = 0; j < n; ++j) {
      __m512 even[16], odd[16];
      for (int p = 0; p < 16; ++p) {
        const __m512i w = _mm512_loadu_si512(b[j] + 32 * p);
        even[p] = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
        odd[p] = _mm512_castsi512_ps(_mm512_and_si512(w, upper));
      }
      for (int64_t m = 0; m < rows; ++m) {
        __m512 e = _mm512_setzero_ps(), o = _mm512_setzero_ps();
        for (int p = 0; p < 16; ++p) {
          e = _mm512_fmadd_ps(_mm512_set1_ps(a[m][2 * p]), even[p], e);
          o = _mm512_fmadd_ps(_mm512_set1_ps(a[m][2 * p + 1]), odd[p], o);
        }
        _mm512_store_ps(c[j][m], _mm512_add_ps(_mm512_load_ps(c[j][m]), _mm512_add_ps(e, o)));
      }
    }
  }
  void store(int n, float* dst, int64_t ld) {
    for (int j = 0; j < n; ++j)
      for (int64_t m = 0; m < rows; ++m) std::memcpy(dst + m * ld + 16 * j, c[j][m], 64);
  }
};

// One task on Tiles (AmxTiles or FmaTiles).
template <class Tiles>
void attend_on(const AttendTask& t) {
  constexpr bool kAmx = std::is_same_v<Tiles, AmxTiles>;
  const int64_t hd = t.head_dim, hdp = round_up(hd, 32), steps = hdp / 32, count = t.pos0 + t.rows - t.base;
  const int64_t np = round_up(count, 32);
  const Bf16Rows r(t, np, hdp);
  const bool keys_as_a = kAmx && line_count(t) == 1 && line(t, 0).count <= 16;  // decode on AMX
  thread_local LineVector<uint16_t> kb, qt, pt, vt, vq;
  thread_local LineVector<float> s, c;
  const int64_t key_blocks = np / 16, pos_blocks = np / 32, dim_blocks = round_up(hd, 16) / 16;
  if (!keys_as_a) {  // the keys in B tiles: [key block][step] of 1 KiB
    kb.resize(static_cast<std::size_t>(key_blocks * steps * 512));
    for (int64_t b = 0; b < key_blocks; ++b)
      for (int64_t st = 0; st < steps; ++st)
        rows_as_b_tile(r.k + 16 * b * hdp, hdp, 32 * st, kb.data() + (b * steps + st) * 512);
  }
  vt.resize(static_cast<std::size_t>(dim_blocks * pos_blocks * 512));  // the values: [dim block][pos block]
  for (int64_t d = 0; d < dim_blocks; ++d)
    for (int64_t b = 0; b < pos_blocks; ++b) values_as_b_tile(r, b, 16 * d, vt.data() + (d * pos_blocks + b) * 512);
  s.resize(static_cast<std::size_t>(16 * np));
  c.resize(16 * 64);
  qt.resize(static_cast<std::size_t>(steps * 512));
  pt.resize(static_cast<std::size_t>(pos_blocks * 512));
  Tiles tiles;
  if constexpr (kAmx) configure_tiles(16);
  for (int64_t h = 0; h < line_count(t); ++h) {
    const Line l = line(t, h);
    for (int64_t i0 = 0; i0 < l.count; i0 += 16) {
      const int64_t M = std::min<int64_t>(16, l.count - i0);
      const auto pos = [&](int64_t i) { return l.pos0 + (i0 + i) * l.step; };
      // the positions (from base) any of the M queries sees: the first query's first to the last one's
      const int64_t lo = first_seen(t, pos(0)) - t.base, hi = pos(M - 1) - t.base;
      const int64_t k0 = lo / 16 * 16, k1 = round_up(hi + 1, 16), b0 = lo / 32, b1 = round_up(hi + 1, 32) / 32;
      if constexpr (!kAmx) tiles.rows = M;
      rows_as_bf16_tiles(l.q + i0 * l.ld, l.ld, M, hd, hdp, 16, qt.data());
      if (!keys_as_a) {  // scores: queries (A) x keys (B), 64 keys a pass
        for (int64_t k = k0; k < k1; k += 64) {
          const int n = static_cast<int>(std::min<int64_t>(4, (k1 - k) / 16));
          tiles.zero();
          for (int64_t st = 0; st < steps; ++st) {
            tiles.load_a(qt.data() + st * 512, 32);
            const uint16_t* b[4];
            for (int j = 0; j < 4; ++j) b[j] = kb.data() + ((k / 16 + std::min(j, n - 1)) * steps + st) * 512;
            tiles.dp(n, b);
          }
          tiles.store(n, s.data() + k, np);
        }
      } else {  // scores transposed: keys (A, their rows) x queries (B), 16 keys a pass
        for (int64_t st = 0; st < steps; ++st) rows_as_b_tile(qt.data() + st * 512, 32, 0, qt.data() + st * 512);
        for (int64_t k = k0; k < k1; k += 16) {
          tiles.zero();
          for (int64_t st = 0; st < steps; ++st) {
            tiles.load_a(r.k + k * hdp + 32 * st, hdp);
            const uint16_t* b[4] = {qt.data() + st * 512, nullptr, nullptr, nullptr};
            tiles.dp(1, b);
          }
          tiles.store(1, c.data(), 16);
          __m512i sums[16];
          for (int i = 0; i < 16; ++i) sums[i] = _mm512_load_si512(c.data() + 16 * i);
          transpose16(sums);
          for (int64_t i = 0; i < M; ++i) _mm512_storeu_si512(s.data() + i * np + k, sums[i]);
        }
      }
      for (int64_t i = 0; i < M; ++i) weights_of(t, pos(i), s.data() + i * np, 32 * b0, 32 * b1);
      // output: weights (A) x values (B), 64 of head_dim a pass, rows [q0, q0 + m) of the tile; vb: the values'
      // tiles, [dim block][pos block from 0]
      const auto output = [&](int64_t q0, int64_t m, int64_t c0, int64_t c1, const uint16_t* vb, int64_t vld) {
        if constexpr (!kAmx) tiles.rows = m;
        rows_as_bf16_tiles(s.data() + q0 * np + 32 * c0, np, m, 32 * (c1 - c0), 32 * (c1 - c0), 16, pt.data());
        for (int64_t d = 0; d < dim_blocks; d += 4) {
          const int n = static_cast<int>(std::min<int64_t>(4, dim_blocks - d));
          tiles.zero();
          for (int64_t b = c0; b < c1; ++b) {
            tiles.load_a(pt.data() + (b - c0) * 512, 32);
            const uint16_t* v[4];
            for (int j = 0; j < 4; ++j) v[j] = vb + ((d + std::min(j, n - 1)) * vld + b) * 512;
            tiles.dp(n, v);
          }
          tiles.store(n, c.data(), 64);
          const int64_t w = std::min<int64_t>(16 * n, hd - 16 * d);
          for (int64_t i = 0; i < m; ++i)
            std::memcpy(l.out + (i0 + q0 + i) * l.ld + 16 * d, c.data() + 64 * i, static_cast<std::size_t>(w) * 4);
        }
      };
      if (r.finite_in(32 * b0, 32 * b1)) {
        output(0, M, b0, b1, vt.data(), pos_blocks);
      } else {  // 0 x inf is NaN: each query alone, the values it does not see as zeros (as decode has them)
        for (int64_t i = 0; i < M; ++i) {
          const int64_t f = first_seen(t, pos(i)) - t.base, e = pos(i) + 1 - t.base, c0 = f / 32;
          const int64_t c1 = round_up(e, 32) / 32;
          vq.resize(static_cast<std::size_t>(dim_blocks * pos_blocks * 512));
          for (int64_t d = 0; d < dim_blocks; ++d)
            for (int64_t b = c0; b < c1; ++b)
              values_as_b_tile(r, b, 16 * d, vq.data() + (d * pos_blocks + b) * 512, f, e);
          output(i, 1, c0, c1, vq.data(), pos_blocks);
        }
      }
    }
  }
  if constexpr (kAmx) _tile_release();
  _mm256_zeroupper();
}

}  // namespace

void attend_bf16amx_tiles(const AttendTask& task) { attend_on<AmxTiles>(task); }
void attend_bf16amx_fma(const AttendTask& task) { attend_on<FmaTiles>(task); }

}  // namespace tandem::runtime::cpu
