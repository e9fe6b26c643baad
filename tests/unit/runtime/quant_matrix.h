// Shared by the kernel tests (kernels_test, int8_dot_kernels_test, bf16amx_kernels_test): a random 8-bit
// matrix, the layouts a kernel meets it in, the row-parallel tree.
#pragma once

#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/row_parallel.h"
#include "runtime/model/weights.h"

namespace tandem::runtime::cpu::test {

// An 8-bit matrix with random codes (every finite FP8 code, subnormals included; INT8 -127..127) and random
// scales on a (br x bc) grid, and the f32 matrix of its values computed independently: f8e4m3_to_f32(code) or
// the integer, times the scale, one rounding.
struct QuantMatrix {
  std::vector<uint8_t> codes;
  std::vector<float> grid, values;
  Matrix q, f;
  // max_code: codes whose value is larger in magnitude are drawn again (huge scales: finite products).
  QuantMatrix(DType dt, int64_t rows, int64_t cols, int64_t br, int64_t bc, std::mt19937& rng, float lo = 1e-4f,
              float hi = 1e-2f, float max_code = 1e9f) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(lo, hi);
    const int64_t sr = (rows + br - 1) / br, sc = (cols + bc - 1) / bc;
    for (int64_t i = 0; i < sr * sc; ++i) grid.push_back(scale(rng));
    for (int64_t i = 0; i < rows * cols; ++i) {
      int b = 0;
      float v = 0;
      do {
        b = byte(rng);
        if (dt == DType::kF8E4M3 && (b & 0x7F) == 0x7F) b ^= 1;  // not NaN
        if (dt == DType::kI8 && b == 0x80) b = 0x81;              // -127 at most
        v = dt == DType::kF8E4M3 ? f8e4m3_to_f32(static_cast<uint8_t>(b)) : static_cast<float>(static_cast<int8_t>(b));
      } while (std::abs(v) > max_code);
      codes.push_back(static_cast<uint8_t>(b));
      values.push_back(v * grid[static_cast<std::size_t>((i / cols) / br * sc + (i % cols) / bc)]);
    }
    q = Matrix{codes.data(), dt, rows, cols, false, {}};
    q.scales.grid = grid.data();
    q.scales.block_rows = br;
    q.scales.block_cols = bc;
    q.scales.ld = sc;
    f = Matrix{values.data(), DType::kF32, rows, cols, false, {}};
  }
};

// The layouts a kernel meets an 8-bit matrix in: whole (row-major and panels), a shard of rows starting
// inside a panel and one on a panel, a column chunk. r0, k0: where its (0, 0) sits in q.
struct LayoutCase {
  const char* what;
  Matrix q;
  int64_t r0, k0;
};
inline std::vector<LayoutCase> layout_cases(const Matrix& q, PanelStore& store) {
  return {{"row-major", q, 0, 0},
          {"panels", store.pack(q), 0, 0},
          {"rows 13..44 copied", store.pack_slice(q, 13, 44, 0, q.cols), 13, 0},
          {"rows 16..44 viewed", store.pack(q).row_view(16, 44), 16, 0},
          {"columns 136..272", store.pack_columns(q, 136, 272), 0, 136}};
}

// Every element of got the same bits as want's (signed zeros and NaNs included).
inline void require_bits(const std::vector<float>& got, const std::vector<float>& want) {
  REQUIRE(got.size() == want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    REQUIRE(std::memcmp(&got[i], &want[i], 4) == 0);
  }
}

// The row-parallel product's fixed tree (row_parallel.h) over part(c), c = 0..7, written out:
// ((p0 + p1) + (p2 + p3)) + ((p4 + p5) + (p6 + p7)).
template <class Part>
float chunk_tree(const Part& part) {
  static_assert(kReduceChunks == 8);
  float p[kReduceChunks];
  for (int c = 0; c < kReduceChunks; ++c) p[c] = part(c);
  return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

}  // namespace tandem::runtime::cpu::test
