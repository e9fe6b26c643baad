// Attention in kBf16Amx's arithmetic (kernels.h: KernelTable::attend): on AMX-BF16 tiles (the "amx-bf16"
// table) and, for CPUs with AVX512-BF16 but no AMX, the same steps with each tdpbf16ps done on FMAs as
// kernels_avx512_bf16amx.cpp does it (the same bits). Compiled with -mavx512bf16 -mavx512vbmi -mamx-tile
// -mamx-bf16; the tile code runs only through the amx-bf16 table.
//
// A task's keys and values are rounded to bf16 rows (a KV row of every kind: kv_row_as_bf16) as they are used:
//   scores: each 16 queries' rows, as A tiles, times the keys rearranged into B tiles (16 keys by 32 of head_dim
//     a tile, a 16 x 16 transpose of pairs each); on AMX with one row of queries (decode), the keys' rows are
//     the A tiles as they are, the queries the B tiles, and the 16 x 16 sums transposed back: no rearranging
//     of the keys, which a decode step reads once;
//   the softmax of kernels.h on each query's scores, the weights outside its positions 0;
//   output: the weights as A tiles (32 positions a tile) times the values in B tiles (a pair of positions a
//     row, 16 of head_dim a tile), from the first block of 32 any of the 16 queries sees, kWindow blocks at a
//     time with the sums carried between.
// A chunk of many queries makes its keys' and values' tiles once for all of them; a decode step stages its rows
// in bounded buffers (up to kStaged positions, then a window at a time), so what a thread keeps grows with the
// context only by the scores.
// Every element is one tdpbf16ps sum in kernels.h's order, whichever of the paths computed it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/amx_tiles.h"
#include "runtime/cpu/bf16_panels.h"
#include "runtime/cpu/bf16amx_panels.h"
#include "runtime/cpu/fp8_kv_row.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/line_aligned.h"

namespace tandem::runtime::cpu {
namespace {

int64_t round_up(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// n values, 16 at a time as floats from values(mask, k) (those the mask keeps), rounded to bf16 at dst, zeros on
// to np.
template <class Values>
void values_as_bf16(int64_t n, int64_t np, uint16_t* dst, Values&& values) {
  for (int64_t k = 0; k < n; k += 16) {
    const __mmask16 m = n - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - k)) - 1u);
    _mm256_mask_storeu_epi16(dst + k, m, (__m256i)_mm512_cvtneps_pbh(values(m, k)));
  }
  std::memset(dst + n, 0, static_cast<std::size_t>(np - n) * 2);
}

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
      return values_as_bf16(n, np, dst, [h](__mmask16 m, int64_t k) {
        return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + k));
      });
    }
    default: {  // FP8 E4M3 with its row scale: its values (widen_fp8_row's) in registers
      const Fp8RowScale fs(row, n);
      return values_as_bf16(n, np, dst, [&](__mmask16 m, int64_t k) { return fp8_row_values16(m, row, k, fs); });
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

// Rows [p, p + n) (from base) of the task's keys or values (rows: t.keys or t.values) as bf16 rows ld apart at
// dst: zeros for positions past the last and for rows not read (nullptr).
void stage(const AttendTask& t, const void* const* rows, int64_t p, int64_t n, int64_t ld, uint16_t* dst) {
  const int64_t count = t.pos0 + t.rows - t.base;
  for (int64_t i = 0; i < n; ++i)
    kv_row_as_bf16(t.kv, p + i < count ? rows[p + i] : nullptr, t.head_dim, ld, dst + i * ld);
}

// Whether ld bf16 (a multiple of 32) at row are all finite: none with an exponent of all ones.
bool finite(const uint16_t* row, int64_t ld) {
  __mmask32 any = 0;
  for (int64_t i = 0; i < ld; i += 32) {
    const __m512i e = _mm512_and_si512(_mm512_loadu_si512(row + i), _mm512_set1_epi16(0x7F80));
    any |= _mm512_cmpeq_epi16_mask(e, _mm512_set1_epi16(0x7F80));
  }
  return any == 0;
}

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

// A block of 32 value rows (v: bf16 rows ld apart), 16 of head_dim from d on, as one B tile at out: row p
// holds each column's pair (rows 2p, 2p + 1). Rows outside [from, to) as zeros.
inline void values_as_b_tile(const uint16_t* v, int64_t ld, int64_t d, uint16_t* out, int64_t from, int64_t to) {
  const __m512i lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11);
  const auto row = [&](int64_t i) {
    if (i < from || i >= to) return _mm512_setzero_si512();
    return _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i * ld + d)));
  };
  for (int p = 0; p < 16; ++p) {
    const __m512i a = row(2 * p), c = row(2 * p + 1);
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
  // C tiles j < n from src + 16 j, rows ld floats apart (what store() wrote).
  void load(int n, const float* src, int64_t ld) {
    const auto stride = static_cast<long>(ld * 4);
    _tile_loadd(0, src, stride);
    if (n > 1) _tile_loadd(1, src + 16, stride);
    if (n > 2) _tile_loadd(2, src + 32, stride);
    if (n > 3) _tile_loadd(3, src + 48, stride);
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
  void load(int n, const float* src, int64_t ld) {
    for (int j = 0; j < n; ++j)
      for (int64_t m = 0; m < rows; ++m) std::memcpy(c[j][m], src + m * ld + 16 * j, 64);
  }
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

constexpr int64_t kWindow = 16;  // blocks of 32 positions whose value tiles the output holds at once
constexpr int64_t kStaged = 4096;  // positions a decode step stages as bf16 rows at once

// One task on Tiles (AmxTiles or FmaTiles). Memory a thread keeps grows with the context by the scores (64 bytes
// a position) and, for a task of several tiles of queries, the keys' and values' tiles (4 bytes a position and
// element of head_dim), made once for all of them; a decode step's keys and values pass through buffers of up
// to kStaged rows each.
template <class Tiles>
class Attend {
 public:
  static constexpr bool kAmx = std::is_same_v<Tiles, AmxTiles>;

  explicit Attend(const AttendTask& t)
      : t_(t), hd_(t.head_dim), hdp_(round_up(hd_, 32)), steps_(hdp_ / 32), count_(t.pos0 + t.rows - t.base),
        np_(round_up(count_, 32)), pos_blocks_(np_ / 32), dim_blocks_(round_up(hd_, 16) / 16) {}

  void run() {
    b_.s.resize(static_cast<std::size_t>(16 * np_));
    b_.qt.resize(static_cast<std::size_t>(steps_ * 512));
    const int64_t staged = std::max(32 * kWindow, std::min(np_, kStaged));
    b_.ks.resize(static_cast<std::size_t>(staged * hdp_));
    b_.vs.resize(static_cast<std::size_t>(staged * hdp_));
    b_.kt.resize(static_cast<std::size_t>(4 * steps_ * 512));
    b_.acc.resize(static_cast<std::size_t>(16 * 16 * dim_blocks_));
    if constexpr (kAmx) configure_tiles(16);
    if (t_.rows == 1 && t_.heads <= 16)
      decode();
    else
      chunk();
    if constexpr (kAmx) _tile_release();
    _mm256_zeroupper();
  }

 private:
  struct Buffers {
    LineVector<uint16_t> qt, ks, kt, kb, vs, vt, vw, pt;
    LineVector<float> s, acc;
    std::vector<int64_t> bad;  // bad[p]: value rows before p (from base) holding an infinity or a NaN
  };
  static Buffers& buffers() {
    thread_local Buffers b;
    return b;
  }

  // One row's queries (one decode step, the heads of a KV head): every key and value read once, so none is kept.
  void decode() {
    const int64_t M = t_.heads, f = first_seen(t_, t_.pos0) - t_.base, e = count_;
    const int64_t b0 = f / 32, b1 = round_up(e, 32) / 32;
    // Rows are staged in one loop of loads (many in flight: a decode step's KV comes from memory): up to
    // kStaged positions, the values beside the keys, as two streams; a longer context a window at a time.
    const bool one = 32 * (b1 - b0) <= kStaged;
    const int64_t kw = one ? 32 * (b1 - b0) : 32 * kWindow;
    if constexpr (!kAmx) tiles_.rows = M;
    rows_as_bf16_tiles(t_.q, t_.ldq_head, M, hd_, hdp_, 16, b_.qt.data());
    if constexpr (kAmx)  // scores transposed: keys (A, their rows) x queries (B)
      for (int64_t st = 0; st < steps_; ++st) rows_as_b_tile(b_.qt.data() + st * 512, 32, 0, b_.qt.data() + st * 512);
    for (int64_t w = 32 * b0; w < 32 * b1; w += kw) {
      const int64_t n = std::min(kw, 32 * b1 - w);
      if (one) {
        for (int64_t i = 0; i < n; ++i) {
          stage(t_, t_.keys, w + i, 1, hdp_, b_.ks.data() + i * hdp_);
          stage(t_, t_.values, w + i, 1, hdp_, b_.vs.data() + i * hdp_);
        }
      } else {
        stage(t_, t_.keys, w, n, hdp_, b_.ks.data());
      }
      if constexpr (kAmx) {  // 16 keys a pass, their sums transposed back
        for (int64_t k = 0; k < n; k += 16) {
          tiles_.zero();
          for (int64_t st = 0; st < steps_; ++st) {
            tiles_.load_a(b_.ks.data() + k * hdp_ + 32 * st, hdp_);
            const uint16_t* b[4] = {b_.qt.data() + st * 512, nullptr, nullptr, nullptr};
            tiles_.dp(1, b);
          }
          alignas(64) float c[16 * 16];
          tiles_.store(1, c, 16);
          __m512i sums[16];
          for (int i = 0; i < 16; ++i) sums[i] = _mm512_load_si512(c + 16 * i);
          transpose16(sums);
          for (int64_t i = 0; i < M; ++i) _mm512_storeu_si512(b_.s.data() + i * np_ + w + k, sums[i]);
        }
      } else {  // queries (A) x keys (B), 64 keys a pass
        for (int64_t k = 0; k < n; k += 64) {
          const int nt = static_cast<int>(std::min<int64_t>(4, (n - k) / 16));
          for (int j = 0; j < nt; ++j)
            for (int64_t st = 0; st < steps_; ++st)
              rows_as_b_tile(b_.ks.data() + (k + 16 * j) * hdp_, hdp_, 32 * st, b_.kt.data() + (j * steps_ + st) * 512);
          scores(b_.kt.data(), nt, b_.s.data() + w + k);
        }
      }
    }
    for (int64_t i = 0; i < M; ++i) weights_of(t_, t_.pos0, b_.s.data() + i * np_, 32 * b0, 32 * b1);
    output(0, M, b0, b1, f, e, nullptr, t_.out, t_.ldq_head, one);
  }

  // Many queries: the keys and values in tiles once, for every tile of 16 queries.
  void chunk() {
    const int64_t key_blocks = np_ / 16;
    b_.kb.resize(static_cast<std::size_t>(key_blocks * steps_ * 512));  // the keys: [key block][step] of 1 KiB
    for (int64_t kb = 0; kb < key_blocks; ++kb) {
      stage(t_, t_.keys, 16 * kb, 16, hdp_, b_.ks.data());
      for (int64_t st = 0; st < steps_; ++st)
        rows_as_b_tile(b_.ks.data(), hdp_, 32 * st, b_.kb.data() + (kb * steps_ + st) * 512);
    }
    b_.vt.resize(static_cast<std::size_t>(dim_blocks_ * pos_blocks_ * 512));  // the values: [dim block][pos block]
    b_.bad.assign(static_cast<std::size_t>(np_ + 1), 0);
    for (int64_t pb = 0; pb < pos_blocks_; ++pb) {
      stage(t_, t_.values, 32 * pb, 32, hdp_, b_.vs.data());
      for (int64_t i = 0; i < 32; ++i) {
        const auto p = static_cast<std::size_t>(32 * pb + i);
        b_.bad[p + 1] = b_.bad[p] + !finite(b_.vs.data() + i * hdp_, hdp_);
      }
      for (int64_t d = 0; d < dim_blocks_; ++d)
        values_as_b_tile(b_.vs.data(), hdp_, 16 * d, b_.vt.data() + (d * pos_blocks_ + pb) * 512, 0, 32);
    }
    for (int64_t h = 0; h < line_count(t_); ++h) {
      const Line l = line(t_, h);
      for (int64_t i0 = 0; i0 < l.count; i0 += 16) {
        const int64_t M = std::min<int64_t>(16, l.count - i0);
        const auto pos = [&](int64_t i) { return l.pos0 + (i0 + i) * l.step; };
        // the positions (from base) any of the M queries sees: the first query's first to the last one's
        const int64_t lo = first_seen(t_, pos(0)) - t_.base, hi = pos(M - 1) - t_.base;
        const int64_t k0 = lo / 16 * 16, k1 = round_up(hi + 1, 16), b0 = lo / 32, b1 = round_up(hi + 1, 32) / 32;
        if constexpr (!kAmx) tiles_.rows = M;
        rows_as_bf16_tiles(l.q + i0 * l.ld, l.ld, M, hd_, hdp_, 16, b_.qt.data());
        for (int64_t k = k0; k < k1; k += 64)
          scores(b_.kb.data() + k / 16 * steps_ * 512, static_cast<int>(std::min<int64_t>(4, (k1 - k) / 16)),
                 b_.s.data() + k);
        for (int64_t i = 0; i < M; ++i) weights_of(t_, pos(i), b_.s.data() + i * np_, 32 * b0, 32 * b1);
        if (b_.bad[static_cast<std::size_t>(32 * b1)] == b_.bad[static_cast<std::size_t>(32 * b0)]) {
          output(0, M, b0, b1, 0, np_, b_.vt.data(), l.out + i0 * l.ld, l.ld);
        } else {  // 0 x inf is NaN: each query alone, the values it does not see as zeros (as decode has them)
          for (int64_t i = 0; i < M; ++i) {
            const int64_t f = first_seen(t_, pos(i)) - t_.base, e = pos(i) + 1 - t_.base;
            output(i, 1, f / 32, round_up(e, 32) / 32, f, e, nullptr, l.out + (i0 + i) * l.ld, l.ld);
          }
        }
      }
    }
  }

  // Scores of the queries in qt (A) with n tiles of 16 keys (kt: [tile][step] of 1 KiB) into s (np_ apart).
  void scores(const uint16_t* kt, int n, float* s) {
    tiles_.zero();
    for (int64_t st = 0; st < steps_; ++st) {
      tiles_.load_a(b_.qt.data() + st * 512, 32);
      const uint16_t* b[4];
      for (int j = 0; j < 4; ++j) b[j] = kt + (std::min(j, n - 1) * steps_ + st) * 512;
      tiles_.dp(n, b);
    }
    tiles_.store(n, s, np_);
  }

  // Weights (A: rows [q0, q0 + m) of the scores) x values (B) over position blocks [c0, c1), into m rows of out
  // (ldo apart), 64 of head_dim a pass, kWindow blocks at a time (the sums carried between in acc). vt: the
  // values' tiles, [dim block][pos block]; nullptr: made here, window by window, the rows outside [f, e) zeros.
  void output(int64_t q0, int64_t m, int64_t c0, int64_t c1, int64_t f, int64_t e, const uint16_t* vt, float* out,
              int64_t ldo, bool staged = false) {
    const int64_t lda = 16 * dim_blocks_;
    if constexpr (!kAmx) tiles_.rows = m;
    b_.pt.resize(static_cast<std::size_t>(kWindow * 512));
    if (!vt) b_.vw.resize(static_cast<std::size_t>(dim_blocks_ * kWindow * 512));
    for (int64_t w0 = c0; w0 < c1; w0 += kWindow) {
      const int64_t w1 = std::min(c1, w0 + kWindow);
      rows_as_bf16_tiles(b_.s.data() + q0 * np_ + 32 * w0, np_, m, 32 * (w1 - w0), 32 * (w1 - w0), 16, b_.pt.data());
      const uint16_t* vb = vt;  // block b's tile of dim block d at vb + (d * vld + b - first) * 512
      int64_t vld = pos_blocks_, first = 0;
      if (!vt) {
        const uint16_t* rows = b_.vs.data() + (staged ? 32 * (w0 - c0) * hdp_ : 0);  // block w0's
        if (!staged) stage(t_, t_.values, 32 * w0, 32 * (w1 - w0), hdp_, b_.vs.data());
        for (int64_t b = w0; b < w1; ++b)
          for (int64_t d = 0; d < dim_blocks_; ++d)
            values_as_b_tile(rows + 32 * (b - w0) * hdp_, hdp_, 16 * d,
                             b_.vw.data() + (d * kWindow + b - w0) * 512, f - 32 * b, e - 32 * b);
        vb = b_.vw.data(), vld = kWindow, first = w0;
      }
      for (int64_t d = 0; d < dim_blocks_; d += 4) {
        const int n = static_cast<int>(std::min<int64_t>(4, dim_blocks_ - d));
        if (w0 == c0)
          tiles_.zero();
        else
          tiles_.load(n, b_.acc.data() + 16 * d, lda);
        for (int64_t b = w0; b < w1; ++b) {
          tiles_.load_a(b_.pt.data() + (b - w0) * 512, 32);
          const uint16_t* v[4];
          for (int j = 0; j < 4; ++j) v[j] = vb + ((d + std::min(j, n - 1)) * vld + b - first) * 512;
          tiles_.dp(n, v);
        }
        tiles_.store(n, b_.acc.data() + 16 * d, lda);
      }
    }
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(out + i * ldo, b_.acc.data() + i * lda, static_cast<std::size_t>(hd_) * 4);
  }

  const AttendTask& t_;
  const int64_t hd_, hdp_, steps_, count_, np_, pos_blocks_, dim_blocks_;
  Buffers& b_ = buffers();
  Tiles tiles_;
};

}  // namespace

void attend_bf16amx_tiles(const AttendTask& task) { Attend<AmxTiles>(task).run(); }
void attend_bf16amx_fma(const AttendTask& task) { Attend<FmaTiles>(task).run(); }

}  // namespace tandem::runtime::cpu
