// kBf16Amx (kernels.h, model.cpu_matmul = "bf16-amx"): bf16 products in the
// arithmetic of AMX's tdpbf16ps — the reference, the AVX-512 FMA table and,
// where the CPU has AMX-BF16, the tile table held to that rule, written out
// here independently, bit for bit (signed zeros, subnormals and all).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"
#include "tests/unit/runtime/bf16amx_rule.h"
#include "tests/unit/runtime/quant_matrix.h"

using namespace tandem::runtime;
using namespace tandem::runtime::cpu;
using tandem::runtime::cpu::test::QuantMatrix;
using tandem::runtime::cpu::test::require_bits;
using tandem::runtime::cpu::test::bf16amx_tables;
using tandem::runtime::cpu::test::rule;

namespace {

// Row n of W (its values, any dtype and layout) against row x, columns [k0, k0 + K).
float rule_at(const float* x, const Matrix& values, int64_t n, int64_t k0, int64_t K) {
  std::vector<float> xs(x, x + K), ws(static_cast<std::size_t>(K));
  for (int64_t k = 0; k < K; ++k) ws[static_cast<std::size_t>(k)] = values.at(n, k0 + k);
  return rule(xs, ws);
}

// Activations over 40 binades, some near 2^-63 (products near the smallest normal), zeros of both signs.
std::vector<float> activations(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(static_cast<std::size_t>(n));
  for (float& v : x) {
    const unsigned r = rng() % 16;
    v = r == 0   ? 0.0f
        : r == 1 ? -0.0f
        : r < 5  ? u(rng) * 0x1p-62f
                 : u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  }
  return x;
}

// bf16 weights of every kind: normal over a wide range, near 2^-63, subnormal, zeros of both signs.
std::vector<uint16_t> bf16_weights(int64_t n, std::mt19937& rng) {
  std::vector<uint16_t> w(static_cast<std::size_t>(n));
  for (uint16_t& h : w) {
    const unsigned r = rng() % 16, sign = (rng() & 1u) << 15, mant = rng() & 0x7Fu;
    const unsigned exp = r == 0 ? 0u : r < 5 ? 127u - 64u + rng() % 4 : 127u - 20u + rng() % 40;
    h = static_cast<uint16_t>(sign | (exp << 7) | (r == 1 ? 0u : mant));
  }
  return w;
}

}  // namespace

TEST_CASE("kBf16Amx on bf16 weights: the reference and the tables are the rule's bits, to the signed zero",
          "[kernels]") {
  const auto tables = bf16amx_tables();
  std::mt19937 rng(41);
  for (const int64_t K : {8, 24, 32, 40, 64, 200, 384, 1024}) {
    for (const int64_t N : {8, 13, 40}) {
      std::vector<uint16_t> bits = bf16_weights(N * K, rng);
      const Matrix raw{bits.data(), DType::kBF16, N, K, false, {}};
      PanelStore store;
      const Matrix w = store.pack(raw);
      REQUIRE(w.panels);
      for (const int64_t M : {1, 3, 4, 5, 15, 16, 17, 28, 32, 33, 40, 48, 49, 64, 65, 80, 81, 96, 97}) {
        const std::vector<float> x = activations(M * K, rng);
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {3, N - 1}, {N / 2, N / 2 + 1}}) {
          std::vector<float> want(static_cast<std::size_t>(M * N), -7.0f), got(want.size(), -7.0f);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = n0; n < n1; ++n)
              want[static_cast<std::size_t>(m * N + n)] = rule_at(x.data() + m * K, raw, n, 0, K);
          INFO("K=" << K << " N=" << N << " M=" << M << " columns " << n0 << ".." << n1);
          matmul_bf16amx_reference(x.data(), K, M, w, n0, n1, got.data(), N);
          require_bits(got, want);
          for (const KernelTable* t : tables) {
            INFO(t->name);
            std::fill(got.begin(), got.end(), -7.0f);
            t->matmul(x.data(), K, M, w, n0, n1, got.data(), N);
            require_bits(got, want);
          }
        }
      }
      if (K % 64 != 0) continue;  // the row-parallel product: each chunk's product, added in the fixed tree
      const auto chunks = split_columns(raw, 0, kReduceChunks, store);
      for (const int count : {1, 2, 4, 8}) {  // chunks [0, count), x's columns for them
        for (const int64_t M : {1, 17, 32, 40, 64, 70, 96, 97}) {
          const std::vector<float> x = activations(M * K, rng);
          std::vector<float> want(static_cast<std::size_t>(M * N));
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              const auto part = [&](int c) {
                return rule_at(x.data() + m * K + chunk_begin(K, c), raw, n, chunk_begin(K, c), K / kReduceChunks);
              };
              const auto tree = [&](const auto& self, int first, int parts) -> float {
                return parts == 1 ? part(first) : self(self, first, parts / 2) + self(self, first + parts / 2, parts / 2);
              };
              want[static_cast<std::size_t>(m * N + n)] = tree(tree, 0, count);
            }
          for (const KernelTable* t : tables)
            for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {3, N - 1}}) {
              INFO(t->name << " tree K=" << K << " N=" << N << " M=" << M << " parts " << count << " columns " << n0
                           << ".." << n1);
              std::vector<float> got(want.size(), -7.0f), expect(want.size(), -7.0f);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = n0; n < n1; ++n)
                  expect[static_cast<std::size_t>(m * N + n)] = want[static_cast<std::size_t>(m * N + n)];
              t->matmul_tree(x.data(), K, M, chunks.data(), count, n0, n1, got.data(), N);
              require_bits(got, expect);
            }
        }
      }
    }
  }
}

TEST_CASE("kBf16Amx over a long K: the AMX table's blocks of rows give the rule's bits", "[kernels]") {
  // The AMX table multiplies a block of rows at a time whose bf16 copy stays in L2 (~1.5 MiB): a K this long
  // makes blocks of 32 rows, so 102 rows (more than the 96 that stream) are four blocks, the last of 6.
  const auto tables = bf16amx_tables();
  std::mt19937 rng(47);
  const int64_t K = 32768, N = 10, M = 102;
  std::vector<uint16_t> bits = bf16_weights(N * K, rng);
  const Matrix raw{bits.data(), DType::kBF16, N, K, false, {}};
  PanelStore store;
  const Matrix w = store.pack(raw);
  const auto chunks = split_columns(raw, 0, kReduceChunks, store);
  const std::vector<float> x = activations(M * K, rng);
  std::vector<float> whole(static_cast<std::size_t>(M * N)), tree(whole.size());
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      whole[static_cast<std::size_t>(m * N + n)] = rule_at(x.data() + m * K, raw, n, 0, K);
      tree[static_cast<std::size_t>(m * N + n)] = test::chunk_tree([&](int c) {
        return rule_at(x.data() + m * K + chunk_begin(K, c), raw, n, chunk_begin(K, c), K / kReduceChunks);
      });
    }
  for (const KernelTable* t : tables) {
    INFO(t->name);
    std::vector<float> got(whole.size(), -7.0f);
    t->matmul(x.data(), K, M, w, 0, N, got.data(), N);
    require_bits(got, whole);
    t->matmul_tree(x.data(), K, M, chunks.data(), kReduceChunks, 0, N, got.data(), N);
    require_bits(got, tree);
  }
}

TEST_CASE("kBf16Amx on 8-bit weights: their values rounded to bf16, every layout; other weights kF32's",
          "[kernels][quant]") {
  const auto tables = bf16amx_tables();
  std::mt19937 rng(43);
  const int64_t N = 44, K = 320;  // 2.5 blocks of 128
  struct Grid {
    DType dt;
    int64_t br, bc;
    float lo = 1e-4f, hi = 1e-2f, max_code = 1e9f;
  };
  // FP8 128 x 128 blocks, INT8 per channel, FP8 per tensor; FP8 blocks with scales near the smallest normal
  // (subnormal products: flushed) and near 2^120 (codes of at most 2^-6: finite products)
  for (const Grid& g :
       {Grid{DType::kF8E4M3, 128, 128}, Grid{DType::kI8, 1, K}, Grid{DType::kF8E4M3, N, K},
        Grid{DType::kF8E4M3, 128, 128, 2e-38f, 4e-38f}, Grid{DType::kF8E4M3, 128, 128, 0x1p120f, 0x1p121f, 0x1p-6f}}) {
    const DType dt = g.dt;
    QuantMatrix w(dt, N, K, g.br, g.bc, rng, g.lo, g.hi, g.max_code);
    PanelStore store;
    for (const auto& c : test::layout_cases(w.q, store)) {
      if (!c.q.panels) continue;  // row-major 8-bit: kF32's products (below)
      const int64_t n = c.q.rows, k = c.q.cols;
      for (const int64_t M : {1, 5, 16, 17, 31, 40, 48, 57, 75, 88, 97}) {
        const std::vector<float> x = activations(M * k, rng);
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {3, n - 2}, {8, 16}}) {
          std::vector<float> want(static_cast<std::size_t>(M * n), -7.0f), got(want.size(), -7.0f);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = n0; j < n1; ++j)
              want[static_cast<std::size_t>(m * n + j)] = rule_at(x.data() + m * k, w.f, c.r0 + j, c.k0, k);
          INFO(c.what << " " << dtype_name(dt) << " M=" << M << " columns " << n0 << ".." << n1);
          matmul_bf16amx_reference(x.data(), k, M, c.q, n0, n1, got.data(), n);
          require_bits(got, want);
          for (const KernelTable* t : tables) {
            INFO(t->name);
            std::fill(got.begin(), got.end(), -7.0f);
            t->matmul(x.data(), k, M, c.q, n0, n1, got.data(), n);
            require_bits(got, want);
          }
        }
      }
    }
  }
  // The row-parallel product of 8-bit parts (FP8 blocks through the table reader, INT8 channels): each chunk's
  // product, added in the fixed tree, on the tiles above 32 rows.
  for (const Grid& g : {Grid{DType::kF8E4M3, 128, 128}, Grid{DType::kI8, 1, K}}) {
    QuantMatrix w(g.dt, N, K, g.br, g.bc, rng, g.lo, g.hi, g.max_code);
    PanelStore store;
    const auto chunks = split_columns(w.q, 0, kReduceChunks, store);
    for (const int64_t M : {5, 40, 57, 70, 96, 97}) {
      const std::vector<float> x = activations(M * K, rng);
      std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size(), -7.0f);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < N; ++j)
          want[static_cast<std::size_t>(m * N + j)] = test::chunk_tree([&](int c) {
            return rule_at(x.data() + m * K + chunk_begin(K, c), w.f, j, chunk_begin(K, c), K / kReduceChunks);
          });
      for (const KernelTable* t : tables) {
        INFO(t->name << " tree " << dtype_name(g.dt) << " M=" << M);
        t->matmul_tree(x.data(), K, M, chunks.data(), kReduceChunks, 0, N, got.data(), N);
        require_bits(got, want);
      }
    }
  }
  // Weights not in panels (row-major 8-bit, f32): the FP32 products, bitwise.
  std::uniform_real_distribution<float> u(-1, 1);
  QuantMatrix w(DType::kF8E4M3, 40, 256, 128, 128, rng);
  for (const Matrix& m : {w.q, w.f}) {
    std::vector<float> x(20 * 256);
    for (float& v : x) v = u(rng);
    std::vector<float> want(20 * 40), got(want.size());
    scalar_kernels().matmul(x.data(), 256, 20, m, 0, 40, want.data(), 40);
    for (const KernelTable* t : tables) {
      t->matmul(x.data(), 256, 20, m, 0, 40, got.data(), 40);
      INFO(t->name << " " << dtype_name(m.dtype));
      require_bits(got, want);
    }
  }
}
