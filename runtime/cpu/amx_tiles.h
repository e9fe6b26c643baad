// The tile configuration both AMX tables use: eight tiles of 64-byte rows. Included only by files compiled with
// -mamx-tile, in an unnamed namespace: each includer has its own copy.
#pragma once

#include <cstdint>

namespace tandem::runtime::cpu {
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-5 (C and A tiles) `rows` rows, 6-7 (B tiles) 16; 64 bytes a row. With `second` rows, C tiles 2-3 and
// A tile 5 take those instead (a second row tile of fewer rows).
inline void configure_tiles(int rows = 16, int second = -1) {
  TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = static_cast<uint8_t>(t >= 6 ? 16 : second >= 0 && (t == 2 || t == 3 || t == 5) ? second : rows);
    c.colsb[t] = 64;
  }
  // GCC 12's _tile_loadconfig does not tell the compiler it reads c, which then drops the stores above
  asm volatile("ldtilecfg %0" : : "m"(c));
}

}  // namespace
}  // namespace tandem::runtime::cpu
