// kInt8Dot (kernels.h, model.cpu_matmul = "int8"): activations quantized per
// row, exact integer sums, one scale product — the reference and the VNNI
// table held to that rule, computed here independently, bit for bit.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"
#include "tests/unit/runtime/quant_matrix.h"

using namespace tandem::runtime;
using namespace tandem::runtime::cpu;
using tandem::runtime::cpu::test::QuantMatrix;
using tandem::runtime::cpu::test::require_bits;

namespace {

// The rule, written out: q = nearest-even(x x (127 / amax)), scale amax / 127.
float quantize_here(const float* x, int64_t n, std::vector<int>& q) {
  float amax = 0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  q.assign(static_cast<std::size_t>(n), 0);
  if (amax == 0) return 0;
  const float inv = 127.0f / amax;
  for (int64_t i = 0; i < n; ++i) q[static_cast<std::size_t>(i)] = static_cast<int>(std::nearbyint(x[i] * inv));
  return amax / 127.0f;
}

// y = float(sum of q x code, in 64 bits) x (x's scale x the row's scale), one output.
float int8dot_here(const float* x, const QuantMatrix& w, int64_t n, int64_t k0, int64_t K) {
  std::vector<int> q;
  const float xs = quantize_here(x, K, q);
  int64_t acc = 0;
  for (int64_t k = 0; k < K; ++k)
    acc += int64_t{q[static_cast<std::size_t>(k)]} *
           static_cast<int8_t>(w.codes[static_cast<std::size_t>(n * w.q.cols + k0 + k)]);
  const float ws = w.grid[static_cast<std::size_t>(n / w.q.scales.block_rows)];
  return static_cast<float>(acc) * (xs * ws);
}

}  // namespace

TEST_CASE("INT8 activation codes: scale max|x|/127, nearest even, zeros and non-finite rows", "[kernels][quant]") {
  std::vector<int8_t> q(8);
  const float a[] = {127.0f, 2.5f, 3.5f, -0.5f, -126.6f, 1.4999999f, 0.0f, -127.0f};  // amax 127: x x 1
  CHECK(quantize_int8_row(a, 8, q.data()) == 1.0f);
  CHECK(q == std::vector<int8_t>{127, 2, 4, 0, -127, 1, 0, -127});
  const float b[] = {1.0f, -2.0f, 0.5f, 2.54f};  // 127 / 2.54 = 50.000004: 50, -100, 25, 127
  CHECK(quantize_int8_row(b, 4, q.data()) == 2.54f / 127.0f);
  CHECK(std::vector<int8_t>(q.begin(), q.begin() + 4) == std::vector<int8_t>{50, -100, 25, 127});
  const float zeros[] = {0.0f, -0.0f, 0.0f};
  q.assign(8, 9);
  CHECK(quantize_int8_row(zeros, 3, q.data()) == 0.0f);
  CHECK(q[0] == 0);
  CHECK(q[2] == 0);
  const float nan[] = {1.0f, std::numeric_limits<float>::quiet_NaN(), 2.0f};
  const float inf[] = {1.0f, -INFINITY, 2.0f};
  CHECK(std::isnan(quantize_int8_row(nan, 3, q.data())));
  CHECK(std::isnan(quantize_int8_row(inf, 3, q.data())));
  CHECK(q[0] == 0);
}

TEST_CASE("kInt8Dot products: the reference and the VNNI table are the rule's bits, every layout, shard and tree",
          "[kernels][quant]") {
  std::vector<const KernelTable*> tables;
  if (avx512_vnni_kernels()) tables.push_back(avx512_vnni_kernels());
  else WARN("no AVX512-VNNI on this CPU: only the reference is checked here");
  if (avx512_amx_kernels()) tables.push_back(avx512_amx_kernels());  // AMX tiles from 16 rows
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t N = 44, K = 320;
  for (const int64_t br : {int64_t{1}, N}) {  // a scale per channel, one for the tensor
    QuantMatrix w(DType::kI8, N, K, br, K, rng);
    PanelStore store;
    auto cases = test::layout_cases(w.q, store);
    cases.push_back({"columns 40..76 (not panels)", store.pack_columns(w.q, 40, 76), 0, 40});
    for (const auto& c : cases) {
      const int64_t n = c.q.rows, k = c.q.cols;
      for (const int64_t M : {1, 2, 3, 5, 8, 9, 16, 17, 40, 70}) {
        std::vector<float> x(static_cast<std::size_t>(M * k));
        for (float& v : x) v = u(rng) * (M % 2 ? 1e-3f : 30.0f);
        if (M == 9) std::fill(x.begin() + k, x.begin() + 2 * k, 0.0f);  // a row of zeros: 0
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {3, n - 2}, {8, 16}, {n / 2, n / 2 + 1}}) {
          std::vector<float> want(static_cast<std::size_t>(M * n), -7.0f), got(want.size(), -7.0f);
          for (int64_t m = 0; m < M; ++m)
            for (int64_t j = n0; j < n1; ++j)
              want[static_cast<std::size_t>(m * n + j)] = int8dot_here(x.data() + m * k, w, c.r0 + j, c.k0, k);
          INFO(c.what << " scale rows " << br << " M=" << M << " columns " << n0 << ".." << n1);
          matmul_int8dot_reference(x.data(), k, M, c.q, n0, n1, got.data(), n);
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
    // The row-parallel product: each chunk's own quantization and product, added in the fixed tree.
    const auto chunks = split_columns(w.q, 0, kReduceChunks, store);
    for (const int64_t M : {1, 9, 33}) {
      std::vector<float> x(static_cast<std::size_t>(M * K));
      for (float& v : x) v = u(rng);
      std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size());
      for (int64_t m = 0; m < M; ++m)
        for (int64_t j = 0; j < N; ++j)
          want[static_cast<std::size_t>(m * N + j)] = test::chunk_tree([&](int c) {
            return int8dot_here(x.data() + m * K + chunk_begin(K, c), w, j, chunk_begin(K, c), K / kReduceChunks);
          });
      for (const KernelTable* t : tables) {
        INFO(t->name << " tree, M=" << M);
        t->matmul_tree(x.data(), K, M, chunks.data(), kReduceChunks, 0, N, got.data(), N);
        require_bits(got, want);
      }
    }
  }
}

TEST_CASE("the INT8 tables: integer sums exact at the widest product, NaN rows NaN, other weights kF32's",
          "[kernels][quant]") {
  const KernelTable* t = avx512_vnni_kernels();
  if (!t) return;  // no AVX512-VNNI here: nothing to hold to its contract
  std::mt19937 rng(31);
  PanelStore store;
  // every code 127 (or -128: compressed-tensors' INT8 range) and every activation at +amax: the sums' largest
  // magnitudes, 127 x 128 x 65536 (with the unsigned operand's offset, 255 x 128 x 65536 < 2^31); on the VNNI tiles
  // (2 rows) and, where the CPU has them, the AMX tiles (18 rows)
  for (const KernelTable* table : {t, avx512_amx_kernels()}) {
    if (!table) continue;
    const int64_t N = 16, K = kInt8DotMaxCols, M = table == t ? 2 : 18;
    std::vector<uint8_t> codes(static_cast<std::size_t>(N * K), 127);
    for (int64_t k = 0; k < K; ++k) codes[static_cast<std::size_t>(K + k)] = 0x80;  // -128
    std::vector<float> grid(N, 0.5f);
    Matrix q{codes.data(), DType::kI8, N, K, false, {}};
    q.scales.grid = grid.data();
    q.scales.block_cols = K;
    const Matrix p = store.pack(q);
    std::vector<float> x(static_cast<std::size_t>(M * K), 3.0f), y(static_cast<std::size_t>(M * N));
    x[static_cast<std::size_t>(K + 5)] = std::numeric_limits<float>::quiet_NaN();
    table->matmul(x.data(), K, M, p, 0, N, y.data(), N);
    const float scale = (3.0f / 127.0f) * 0.5f;
    const float want = static_cast<float>(int64_t{127} * 127 * K) * scale;
    const float negative = static_cast<float>(int64_t{127} * -128 * K) * scale;
    INFO(table->name);
    for (int64_t m = 0; m < M; ++m) {
      if (m == 1) {
        for (int64_t j = 0; j < N; ++j) CHECK(std::isnan(y[static_cast<std::size_t>(N + j)]));
        continue;
      }
      CHECK(y[static_cast<std::size_t>(m * N)] == want);
      CHECK(y[static_cast<std::size_t>(m * N + 1)] == negative);
      CHECK(y[static_cast<std::size_t>(m * N + 2)] == want);
    }
  }
  {  // FP8 and bf16 weights: the FP32 products, bitwise
    std::uniform_real_distribution<float> u(-1, 1);
    QuantMatrix w(DType::kF8E4M3, 40, 256, 128, 128, rng);
    std::vector<uint16_t> b(w.values.size());
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(w.values[i]);
    for (const Matrix& m : {store.pack(w.q), store.pack(Matrix{b.data(), DType::kBF16, 40, 256, false, {}})}) {
      std::vector<float> x(20 * 256);
      for (float& v : x) v = u(rng);
      std::vector<float> want(20 * 40), got(want.size());
      scalar_kernels().matmul(x.data(), 256, 20, m, 0, 40, want.data(), 40);
      for (const KernelTable* table : {t, avx512_amx_kernels()}) {
        if (!table) continue;
        table->matmul(x.data(), 256, 20, m, 0, 40, got.data(), 40);
        INFO(table->name << " " << dtype_name(m.dtype));
        require_bits(got, want);
      }
    }
  }
}
