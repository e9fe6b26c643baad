// The bf16 tile arithmetic (kernels.h, MatmulMode::kBf16Amx) on Intel's AMX: the "amx-bf16" table, where one
// instruction (tdpbf16ps) multiplies 16 x 32 bf16 of activations by 32 x 16 of weights into a 16 x 16 tile of
// float sums, in the order kernels.h states (its FMA twin: kernels_avx512_bf16amx.cpp). This file alone is
// compiled with -mavx512bf16 -mavx512vbmi -mamx-tile -mamx-bf16; its code runs only where CPUID says AMX-BF16 and
// Linux grants the tile state.
//
// More than 32 rows: x's rows rounded to bf16 in tiles; for a group of column blocks (16 columns each), their
// weights rearranged once into the B tiles' layout (the two k of a pair side by side, a row of the tile per pair)
// and multiplied by every pair of row tiles, 32 k at a time, two column blocks at once (2 x 2 C tiles); a
// row-parallel product's parts in turn, their sums added in the tree in L1. Up to 96 rows (decode): the weights
// rearranged 32 k at a time as they stream, against one or two A tiles (up to 32 rows: a tree's parts too) or
// three to six.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/cpu/amx_tiles.h"
#include "runtime/cpu/bf16amx_panels.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"

namespace tandem::runtime::cpu {
namespace {

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

// x's columns for each part in turn (part c's follow part c - 1's), M rows of them rounded to bf16 in the A tiles'
// layout (rows_as_bf16_tiles: `rows` rows, zeros past M; k padded to 32), into xb; part c's start at at[c].
void parts_as_bf16_tiles(const float* x, int64_t ldx, int64_t M, int64_t rows, const Matrix* parts, int count,
                         LineVector<uint16_t>& xb, std::vector<int64_t>& at) {
  at.resize(static_cast<std::size_t>(count) + 1);
  at[0] = 0;
  for (int c = 0; c < count; ++c)
    at[static_cast<std::size_t>(c) + 1] = at[static_cast<std::size_t>(c)] + rows * ((parts[c].cols + 31) / 32 * 32);
  xb.resize(static_cast<std::size_t>(at[static_cast<std::size_t>(count)]));
  int64_t k0 = 0;
  for (int c = 0; c < count; ++c) {
    const int64_t K = parts[c].cols;
    rows_as_bf16_tiles(x + k0, ldx, M, K, (K + 31) / 32 * 32, rows, xb.data() + at[static_cast<std::size_t>(c)]);
    k0 += K;
  }
}

// One part of a product on the tiles: its rows of x in tiles (parts_as_bf16_tiles), its 32-k steps, and where
// its weights sit in a packed column block.
struct TilePart {
  const uint16_t* xb;
  int64_t steps;
  int64_t offset;
};

constexpr int64_t kStreamRows = 32;  // up to these rows (decode), matmul_stream; more, matmul_tiles
constexpr int64_t kTallRows = 96;    // up to these rows, matmul_stream_tall (a tree's parts together)
constexpr int kTreeLevels = 8;       // partials on a tree's stack: up to kTileParts parts
constexpr int kTileParts = 1 << (kTreeLevels - 1);

// Row tiles 2 t and 2 t + 1 against two column blocks (C tiles 0-3, 2 x 2 of 16 x 16; A in 4-5, B in 6-7), for
// each part in turn from +0, the parts' sums added in matmul_tree_by_parts' tree (a part's 32 x 32 sums pushed,
// the top two added while they are of one level), the rows below M and the blocks' columns stored into y.
void tile_tree(const TilePart* parts, int count, int64_t t, int64_t M, const ColumnBlock& b0, const ColumnBlock& b1,
               float* y, int64_t ldy) {
  alignas(64) float slot[kTreeLevels][4 * 256];  // a level's four C tiles, 256 floats each
  TreeLevels levels;
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
    if (count == 1 && 32 * t + 32 <= M && b0.c0 == 0 && b0.c1 == 16 && b1.c0 == 0 && b1.c1 == 16) {
      // One part and every element stored: the tiles straight into y (a 512-row product's tiles 6-12% faster, one
      // core, against the copy through slot below)
      const auto stride = static_cast<long>(ldy * 4);
      float* y0 = y + 32 * t * ldy;
      _tile_stored(0, y0, stride);
      _tile_stored(1, y0 + 16, stride);
      _tile_stored(2, y0 + 16 * ldy, stride);
      _tile_stored(3, y0 + 16 * ldy + 16, stride);
      return;
    }
    float* top = slot[levels.depth()];
    _tile_stored(0, top, 64);
    _tile_stored(1, top + 256, 64);
    _tile_stored(2, top + 512, 64);
    _tile_stored(3, top + 768, 64);
    levels.push([&](int l, int r) {
      for (int i = 0; i < 4 * 256; i += 16)
        _mm512_store_ps(slot[l] + i, _mm512_add_ps(_mm512_load_ps(slot[l] + i), _mm512_load_ps(slot[r] + i)));
    });
  }
  const ColumnBlock* cb[2] = {&b0, &b1};
  for (int i = 0; i < 2; ++i) {  // rows 32 t + 16 i on
    const int64_t m0 = t * 32 + 16 * i;
    if (m0 >= M) break;
    const int64_t rows = std::min<int64_t>(16, M - m0);
    for (int j = 0; j < 2; ++j) {
      const __mmask16 mask = columns(cb[j]->c0, cb[j]->c1);
      for (int64_t m = 0; m < rows; ++m)
        _mm512_mask_storeu_ps(y + (m0 + m) * ldy + 16 * j, mask, _mm512_load_ps(slot[0] + 256 * (2 * i + j) + 16 * m));
    }
  }
}

// More than 32 rows: y = the tree over parts c (count a power of two, at most kTileParts; one part: its product) of x's
// columns for part c (following part c - 1's) times parts[c], packs[c] rearranging its weights. x's rows rounded to
// bf16 in tiles, part by part; then for a group of column blocks (16 columns each, all the parts' k), their weights
// rearranged once into the B tiles' layout (~512 KiB) and multiplied by every pair of row tiles, two column blocks
// at once. A row-parallel product's partials never leave L1 (matmul_tree_by_parts wrote each part's M x N to
// memory and added them there).
void tiles_block(const float* x, int64_t ldx, int64_t M, const Matrix* parts, const PackBlock* packs, int count,
                 int64_t n0, int64_t n1, float* y, int64_t ldy) {
  const int64_t pairs = (M + 31) / 32;
  thread_local LineVector<uint16_t> xb, packed;
  thread_local std::vector<int64_t> at;
  thread_local std::vector<TilePart> tp;
  parts_as_bf16_tiles(x, ldx, M, 32 * pairs, parts, count, xb, at);
  tp.resize(static_cast<std::size_t>(count));
  int64_t block_elems = 0;  // one column block of all parts
  for (int c = 0; c < count; ++c) {
    const int64_t Kp = (parts[c].cols + 31) / 32 * 32;
    tp[static_cast<std::size_t>(c)] = {xb.data() + at[static_cast<std::size_t>(c)], Kp / 32, block_elems};
    block_elems += 16 * Kp;
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
        packs[c](parts[c], p, n1, 32 * tp[static_cast<std::size_t>(c)].steps,
                 b + tp[static_cast<std::size_t>(c)].offset);
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

// Up to 32 rows (decode): one A tile of M rows (two: 16 and M - 16); for each four panels (32 columns), 32 k at
// a time, their B tiles rearranged into a 2 KiB slab (in L1) and multiplied at once, the weights streamed once.
// (The groups of matmul_tiles wrote each weight into a 512 KiB buffer first: at 32 rows, a decode step of 32
// sequences, that took more time than the tiles.)
template <class Reader>
void matmul_stream(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                   int64_t ldy) {
  const int64_t K = W.cols, Kp = (K + 31) / 32 * 32;
  thread_local LineVector<uint16_t> xb;
  rows_as_bf16(x, ldx, M, K, xb, Kp, M);
  alignas(64) uint16_t slabs[2][2][16 * 32];  // two in turn: a step's rearranging never waits for the last tile loads
  alignas(64) float c[4][16 * 16];            // C tiles 0-1: rows 0-15, 2-3: rows 16 on; A tiles 4, 5
  const bool two = M > 16;
  configure_tiles(static_cast<int>(std::min<int64_t>(M, 16)), static_cast<int>(two ? M - 16 : 16));
  const uint16_t* second = two ? xb.data() + 16 * Kp : nullptr;
  for (int64_t p = n0 / 8 * 8; p < n1; p += 32) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
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
      if (two) {
        _tile_loadd(5, second + k, Kp * 2);
        _tile_dpbf16ps(2, 5, 6);
      }
      if (has[2]) {
        _tile_loadd(7, slab[1], 64);
        _tile_dpbf16ps(1, 4, 7);
        if (two) _tile_dpbf16ps(3, 5, 7);
      }
    }
    _tile_stored(0, c[0], 64);
    if (has[2]) _tile_stored(1, c[1], 64);
    if (two) {
      _tile_stored(2, c[2], 64);
      if (has[2]) _tile_stored(3, c[3], 64);
    }
    for (int j = 0; j < 2 && has[2 * j]; ++j) {
      const int64_t first = p + 16 * j;
      const int c0 = static_cast<int>(std::max<int64_t>(n0, first) - first);
      const int c1 = static_cast<int>(std::min<int64_t>(n1, first + 16) - first);
      const __mmask16 mask = columns(c0, c1);
      for (int64_t m = 0; m < M; ++m)
        _mm512_mask_storeu_ps(y + m * ldy + first, mask, _mm512_load_ps(c[j + (m < 16 ? 0 : 2)] + 16 * (m % 16)));
    }
  }
  _tile_release();
  _mm256_zeroupper();
}

// matmul_stream_tall's buffers, one set a thread for all its instantiations: x's rows in tiles, and where each
// part's begin.
struct TallBuffers {
  LineVector<uint16_t> xb;
  std::vector<int64_t> at;
};
TallBuffers& tall_buffers() {
  thread_local TallBuffers b;
  return b;
}

// 33 to 96 rows (a decode step of up to 96 sequences; job.max_num_seqs is 64 by default): y = the tree over parts
// c (as tiles_block takes them; one part: its product). R = 3 to 6 row tiles of x (in the A tiles' layout, rows
// past M zeros; each A tile loaded into tile 7 just before its product) against one B tile (6), C tiles 0 to R - 1.
// For each two panels (16 columns) and each part, 32 k at a time, their B tile rearranged into a 1 KiB slab (in
// L1): the weights streamed once; the parts' sums added in the tree in L1, as tile_tree adds them. (matmul_tiles
// rearranges each weight into a 512 KiB buffer first, then multiplies. One core's 3072 x 1024 product at 48, 64, 80
// and 96 rows took 0.55, 0.64, 0.79 and 0.82 ms that way, 0.42, 0.50, 0.57 and 0.66 ms this way; at 128 rows the
// two ways are on par.)
template <class Reader, int R>
void matmul_stream_tall(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0,
                        int64_t n1, float* y, int64_t ldy) {
  static_assert(R >= 3 && R <= 6);
  TallBuffers& buffers = tall_buffers();
  parts_as_bf16_tiles(x, ldx, M, 16 * R, parts, count, buffers.xb, buffers.at);
  alignas(64) uint16_t slabs[2][16 * 32];  // two in turn, as in matmul_stream
  alignas(64) float slot[kTreeLevels][R * 256];  // a level's R C tiles, 256 floats each
  configure_tiles();
  for (int64_t p = n0 / 8 * 8; p < n1; p += 16) {
    const bool second = p + 8 < n1;
    TreeLevels levels;
    for (int c = 0; c < count; ++c) {
      const int64_t K = parts[c].cols, Kp = (K + 31) / 32 * 32;
      const uint16_t* xc = buffers.xb.data() + buffers.at[static_cast<std::size_t>(c)];  // this part's row tiles
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      if constexpr (R > 3) _tile_zero(3);
      if constexpr (R > 4) _tile_zero(4);
      if constexpr (R > 5) _tile_zero(5);
      Reader r0(parts[c], p), r1(parts[c], second ? p + 8 : p);
      NoPanel none;
      const int64_t ts = Kp / 32 * 512;  // one row tile's k-steps
      for (int64_t k = 0; k < Kp; k += 32) {
        const int64_t kk = std::min<int64_t>(32, K - k);
        uint16_t* slab = slabs[(k / 32) % 2];
        if (second)
          pack_slab(r0, r1, k, kk, slab);
        else
          pack_slab(r0, none, k, kk, slab);
        _tile_loadd(6, slab, 64);
        const uint16_t* a = xc + 16 * k;  // k-step k / 32 of row tile 0
        _tile_loadd(7, a, 64);
        _tile_dpbf16ps(0, 7, 6);
        _tile_loadd(7, a + ts, 64);
        _tile_dpbf16ps(1, 7, 6);
        _tile_loadd(7, a + 2 * ts, 64);
        _tile_dpbf16ps(2, 7, 6);
        if constexpr (R > 3) {
          _tile_loadd(7, a + 3 * ts, 64);
          _tile_dpbf16ps(3, 7, 6);
        }
        if constexpr (R > 4) {
          _tile_loadd(7, a + 4 * ts, 64);
          _tile_dpbf16ps(4, 7, 6);
        }
        if constexpr (R > 5) {
          _tile_loadd(7, a + 5 * ts, 64);
          _tile_dpbf16ps(5, 7, 6);
        }
      }
      float* top = slot[levels.depth()];
      _tile_stored(0, top, 64);
      _tile_stored(1, top + 256, 64);
      _tile_stored(2, top + 512, 64);
      if constexpr (R > 3) _tile_stored(3, top + 768, 64);
      if constexpr (R > 4) _tile_stored(4, top + 1024, 64);
      if constexpr (R > 5) _tile_stored(5, top + 1280, 64);
      levels.push([&](int l, int r) {
        for (int i = 0; i < R * 256; i += 16)
          _mm512_store_ps(slot[l] + i, _mm512_add_ps(_mm512_load_ps(slot[l] + i), _mm512_load_ps(slot[r] + i)));
      });
    }
    const int c0 = static_cast<int>(std::max<int64_t>(n0, p) - p);
    const int c1 = static_cast<int>(std::min<int64_t>(n1, p + 16) - p);
    const __mmask16 mask = columns(c0, c1);
    for (int64_t m = 0; m < M; ++m)
      _mm512_mask_storeu_ps(y + m * ldy + p, mask, _mm512_load_ps(slot[0] + 16 * m));
  }
  _tile_release();
  _mm256_zeroupper();
}

// matmul_stream_tall with R = ceil(M / 16) row tiles.
template <class Reader>
void matmul_tall(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0, int64_t n1,
                 float* y, int64_t ldy) {
  if (M > 80)
    matmul_stream_tall<Reader, 6>(x, ldx, M, parts, count, n0, n1, y, ldy);
  else if (M > 64)
    matmul_stream_tall<Reader, 5>(x, ldx, M, parts, count, n0, n1, y, ldy);
  else if (M > 48)
    matmul_stream_tall<Reader, 4>(x, ldx, M, parts, count, n0, n1, y, ldy);
  else
    matmul_stream_tall<Reader, 3>(x, ldx, M, parts, count, n0, n1, y, ldy);
}

void matmul_amx_bf16(const float* x, int64_t ldx, int64_t M, const Matrix& W, int64_t n0, int64_t n1, float* y,
                     int64_t ldy) {
  if (M <= 0) return;  // no rows: no tile of 0 rows to configure
  const bool ours = with_reader(W, [&](auto r) {
    using Reader = typename decltype(r)::type;
    if (M > kTallRows) {
      const PackBlock pack = pack_block<Reader>;
      matmul_tiles(x, ldx, M, &W, &pack, 1, n0, n1, y, ldy);
    } else if (M > kStreamRows) {
      matmul_tall<Reader>(x, ldx, M, &W, 1, n0, n1, y, ldy);
    } else {
      matmul_stream<Reader>(x, ldx, M, W, n0, n1, y, ldy);
    }
  });
  if (!ours) avx512_kernels()->matmul(x, ldx, M, W, n0, n1, y, ldy);  // kF32's
}

void matmul_tree_amx_bf16(const float* x, int64_t ldx, int64_t M, const Matrix* parts, int count, int64_t n0,
                          int64_t n1, float* y, int64_t ldy) {
  if (M <= 0) return;
  // Another table's tree (or the parts one at a time) takes the rows that table asks for a call: this table's
  // 1024 rows would be that many rows of partials in memory.
  const auto in_blocks = [&](auto&& tree) {
    const int64_t rows = avx512_kernels()->tree_rows;
    for (int64_t r0 = 0; r0 < M; r0 += rows) tree(x + r0 * ldx, std::min(rows, M - r0), y + r0 * ldy);
  };
  thread_local std::vector<PackBlock> packs;
  packs.assign(static_cast<std::size_t>(count), nullptr);
  for (int c = 0; c < count; ++c) {  // each part's product as matmul makes it, added in the tree
    PackBlock& pack = packs[static_cast<std::size_t>(c)];
    if (!with_reader(parts[c], [&](auto r) { pack = pack_block<typename decltype(r)::type>; }))
      return in_blocks([&](const float* xb, int64_t rb, float* yb) {  // kF32's
        avx512_kernels()->matmul_tree(xb, ldx, rb, parts, count, n0, n1, yb, ldy);
      });
  }
  // 33 to 96 rows, the parts one reader's (chunks of one matrix): streamed, the tree in L1 (decode 64 on the bench
  // model 1-5% faster than on matmul_tiles)
  if (M > kStreamRows && M <= kTallRows && count <= kTileParts &&
      std::all_of(packs.begin(), packs.end(), [&](PackBlock b) { return b == packs[0]; })) {
    with_reader(parts[0], [&](auto r) {
      matmul_tall<typename decltype(r)::type>(x, ldx, M, parts, count, n0, n1, y, ldy);
    });
    return;
  }
  if (M > kStreamRows && count <= kTileParts)
    return matmul_tiles(x, ldx, M, parts, packs.data(), count, n0, n1, y, ldy);
  in_blocks([&](const float* xb, int64_t rb, float* yb) {
    matmul_tree_by_parts(*amx_bf16_kernels(), xb, ldx, rb, parts, count, n0, n1, yb, ldy);
  });
}

}  // namespace

const KernelTable* amx_bf16_kernels() {
  static const KernelTable* table = []() -> const KernelTable* {
    const KernelTable* base = avx512_bf16amx_kernels();
    if (!base || !amx_usable(22)) return nullptr;  // AMX-BF16
    static const KernelTable t{
        "amx-bf16",         matmul_amx_bf16,      base->dot,           base->axpy,    base->dot_rows,
        base->weighted_sum, matmul_tree_amx_bf16, base->widen_fp8_row, base->softmax, 1024,
        attend_bf16amx_tiles};
    return &t;
  }();
  return table;
}

}  // namespace tandem::runtime::cpu
