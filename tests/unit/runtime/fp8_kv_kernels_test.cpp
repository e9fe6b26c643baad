// FP8 KV rows (kernels.h): quantized from a row alone, widened to code x
// scale, and attention on them the bits of the float32 kernels on the
// widened rows — on every table this CPU runs.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.h"

using namespace tandem::runtime;
using namespace tandem::runtime::cpu;

namespace {

std::vector<const KernelTable*> float32_tables() {
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  for (const KernelTable* t : {avx2_kernels(), avx512_kernels(), avx512_gfni_kernels()})
    if (t) tables.push_back(t);
  return tables;
}

}  // namespace

TEST_CASE("FP8 KV rows: scale max|x|/448, nearest codes, widened to code x scale the same on every table",
          "[kernels][kv]") {
  std::mt19937 rng(11);
  const std::vector<const KernelTable*> tables = float32_tables();
  const float* e4m3 = f8e4m3_table();
  for (const int64_t n : {4, 8, 24, 64, 128, 132}) {
    for (const float magnitude : {1e-30f, 1e-3f, 1.0f, 300.0f, 1e30f}) {  // 1e30: scale x 2^120 overflows
      std::normal_distribution<float> g(0.0f, magnitude);
      std::vector<float> x(static_cast<std::size_t>(n));
      for (auto& v : x) v = g(rng);
      x[0] = -0.0f;
      std::vector<uint8_t> row(static_cast<std::size_t>(n + 4));
      quantize_fp8_row(x.data(), n, row.data());
      std::vector<uint8_t> scalar(row.size());
      quantize_fp8_row_scalar(x.data(), n, scalar.data());
      REQUIRE(scalar == row);  // whichever way this CPU took
      float amax = 0, scale;
      for (float v : x) amax = std::max(amax, std::fabs(v));
      std::memcpy(&scale, row.data() + n, 4);
      REQUIRE(scale == amax / 448.0f);
      for (int64_t i = 0; i < n; ++i) {
        REQUIRE(row[static_cast<std::size_t>(i)] == f32_to_f8e4m3(x[static_cast<std::size_t>(i)] / scale));
        REQUIRE((row[static_cast<std::size_t>(i)] & 0x7F) != 0x7F);  // never a NaN code
      }
      for (const KernelTable* t : tables) {
        std::vector<float> wide(static_cast<std::size_t>(n), -1.0f);
        t->widen_fp8_row(row.data(), n, wide.data());
        for (int64_t i = 0; i < n; ++i) {
          const float want = e4m3[row[static_cast<std::size_t>(i)]] * scale;
          INFO(t->name << " n " << n << " magnitude " << magnitude << " i " << i);
          REQUIRE(std::memcmp(&wide[static_cast<std::size_t>(i)], &want, 4) == 0);
          REQUIRE(std::fabs(wide[static_cast<std::size_t>(i)] - x[static_cast<std::size_t>(i)]) <=
                  amax / 16.0f + 1e-45f);  // within half an E4M3 step of the largest binade
        }
      }
    }
  }
  SECTION("quotients of every kind: rows whose largest value is 448 (scale 1, so each quotient is its value) hold "
          "every 97th float pattern up to 448 and every tie between codes, both signs, and get f32_to_f8e4m3's "
          "codes") {
    std::vector<float> x(128);
    std::vector<uint8_t> row(132);
    int64_t differ = 0, rows = 0;
    uint32_t b = 0;
    while (b < 0x43E00000u) {
      x[0] = 448.0f;
      for (std::size_t i = 1; i < x.size(); ++i, b = std::min(b + 97, 0x43E00000u)) {
        std::memcpy(&x[i], &b, 4);
        if (i % 2) x[i] = -x[i];
      }
      quantize_fp8_row(x.data(), 128, row.data());
      float scale;
      std::memcpy(&scale, row.data() + 128, 4);
      REQUIRE(scale == 1.0f);
      for (std::size_t i = 0; i < x.size(); ++i) differ += row[i] != f32_to_f8e4m3(x[i]);
      std::vector<uint8_t> scalar(row.size());
      quantize_fp8_row_scalar(x.data(), 128, scalar.data());
      differ += scalar != row;
      ++rows;
    }
    // and every pair of neighbouring codes' midpoint (a tie) with the floats either side of it
    std::vector<float> near;
    for (int c = 0; c < 0x7E; ++c) {
      const float mid = (e4m3[c] + e4m3[c + 1]) / 2;  // exact in float32
      for (const float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 448.0f)}) near.insert(near.end(), {v, -v});
    }
    for (std::size_t at = 0; at < near.size(); at += 127, ++rows) {
      x.assign(128, 0.0f);
      x[0] = 448.0f;
      std::copy(near.begin() + static_cast<std::ptrdiff_t>(at),
                near.begin() + static_cast<std::ptrdiff_t>(std::min(near.size(), at + 127)), x.begin() + 1);
      quantize_fp8_row(x.data(), 128, row.data());
      for (std::size_t i = 0; i < x.size(); ++i) differ += row[i] != f32_to_f8e4m3(x[i]);
    }
    INFO(rows << " rows");
    CHECK(differ == 0);
  }
  SECTION("a row of zeros has scale 0 and reads back as zeros; a NaN or infinity makes the row NaN") {
    std::vector<float> x(16, 0.0f);
    std::vector<uint8_t> row(20);
    for (const float bad : {0.0f, NAN, INFINITY}) {
      x[3] = bad;
      quantize_fp8_row(x.data(), 16, row.data());
      std::vector<uint8_t> scalar(20);
      quantize_fp8_row_scalar(x.data(), 16, scalar.data());
      CHECK(scalar == row);
      for (const KernelTable* t : tables) {
        std::vector<float> wide(16);
        t->widen_fp8_row(row.data(), 16, wide.data());
        for (float v : wide) CHECK((bad == 0.0f ? v == 0.0f : std::isnan(v)));
      }
    }
  }
}

TEST_CASE("attention on FP8 KV rows gives the bits of the float32 kernels on the widened rows, every table",
          "[kernels][kv]") {
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const std::vector<const KernelTable*> tables = float32_tables();
  // head sizes on and off multiples of 8 and 16; row counts around the key tiles (8) and the widened blocks (64);
  // row magnitudes from subnormal codes to scales past 2^7 (scale x 2^120 overflows), mixed within a tile
  for (const int64_t n : {8, 12, 64, 80, 128}) {
    for (const int64_t count : {1, 7, 8, 17, 70}) {
      std::vector<std::vector<uint8_t>> store(static_cast<std::size_t>(count));
      std::vector<const void*> rows, wide_rows;
      std::vector<std::vector<float>> wide(static_cast<std::size_t>(count));
      for (int64_t r = 0; r < count; ++r) {
        const float magnitude = r % 5 == 3 ? 1e5f : r % 5 == 1 ? 1e-38f : 1.0f;
        std::vector<float> x(static_cast<std::size_t>(n));
        for (auto& v : x) v = u(rng) * magnitude;
        auto& row = store[static_cast<std::size_t>(r)];
        row.resize(static_cast<std::size_t>(n + 4));
        quantize_fp8_row(x.data(), n, row.data());
        auto& w = wide[static_cast<std::size_t>(r)];
        w.resize(static_cast<std::size_t>(n));
        scalar_kernels().widen_fp8_row(row.data(), n, w.data());
        rows.push_back(row.data());
        wide_rows.push_back(w.data());
      }
      for (const int64_t M : {1, 2, 5, 7}) {
        std::vector<float> q(static_cast<std::size_t>(M * n)), p(static_cast<std::size_t>(M * count));
        for (auto& v : q) v = u(rng);
        for (auto& v : p) v = u(rng);
        std::vector<float> want_s(static_cast<std::size_t>(M * count)), want_o(static_cast<std::size_t>(M * n));
        scalar_kernels().dot_rows(q.data(), n, M, DType::kF32, wide_rows.data(), count, n, want_s.data(), count);
        scalar_kernels().weighted_sum(p.data(), count, M, DType::kF32, wide_rows.data(), count, n, false,
                                      want_o.data(), n);
        for (const KernelTable* t : tables) {
          INFO(t->name << " n " << n << " rows " << count << " M " << M);
          std::vector<float> s(want_s.size(), -7.0f), o(want_o.size(), -7.0f), acc(want_o.size(), 0.0f);
          t->dot_rows(q.data(), n, M, DType::kF8E4M3, rows.data(), count, n, s.data(), count);
          CHECK(std::memcmp(s.data(), want_s.data(), 4 * s.size()) == 0);
          t->weighted_sum(p.data(), count, M, DType::kF8E4M3, rows.data(), count, n, false, o.data(), n);
          CHECK(std::memcmp(o.data(), want_o.data(), 4 * o.size()) == 0);
          // accumulate: the first rows, then the rest on top, as the attention's parts do
          const int64_t half = count / 2;
          t->weighted_sum(p.data(), count, M, DType::kF8E4M3, rows.data(), half, n, false, acc.data(), n);
          t->weighted_sum(p.data() + half, count, M, DType::kF8E4M3, rows.data() + half, count - half, n, true,
                          acc.data(), n);
          CHECK(std::memcmp(acc.data(), want_o.data(), 4 * acc.size()) == 0);
        }
      }
    }
  }
}
