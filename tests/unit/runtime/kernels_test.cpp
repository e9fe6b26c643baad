#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "runtime/cpu/kernels.h"
#include "runtime/cpu/row_parallel.h"
#include "tests/unit/runtime/quant_matrix.h"

using namespace tandem::runtime;
using namespace tandem::runtime::cpu;
using tandem::runtime::cpu::test::QuantMatrix;

namespace {

struct RandomMatrix {
  std::vector<uint8_t> bytes;
  Matrix m;
  RandomMatrix(DType dt, int64_t rows, int64_t cols, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1, 1);
    bytes.resize(static_cast<std::size_t>(rows * cols) * dtype_size(dt));
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = u(rng);
      if (dt == DType::kF32) std::memcpy(bytes.data() + 4 * i, &v, 4);
      else {
        const uint16_t h = dt == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
      }
    }
    m = Matrix{bytes.data(), dt, rows, cols, false, {}};
  }
};

}  // namespace

TEST_CASE("the panel layout moves weights, never changes a result bit", "[kernels]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  if (avx2_kernels()) tables.push_back(avx2_kernels());
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t N : {5, 8, 37, 100}) {
      const int64_t K = 72;
      RandomMatrix w(dt, N, K, rng);
      PanelStore store;
      const Matrix p = store.pack(w.m);
      REQUIRE(p.panels);
      REQUIRE(store.bytes() == static_cast<std::size_t>((N + 7) / 8 * 8 * K) * dtype_size(dt));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) REQUIRE(p.at(n, k) == w.m.at(n, k));
      for (int64_t M : {1, 2, 3, 4, 7, 13}) {
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (auto& v : x) v = u(rng);
        std::vector<float> ref(static_cast<std::size_t>(M * N));
        scalar_kernels().matmul(x.data(), K, M, w.m, 0, N, ref.data(), N);
        for (const KernelTable* t : tables) {
          // The whole matrix, and column ranges that start and end inside panels.
          for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {N / 3, N}, {1, N - 1}, {N / 2, N / 2 + 1}}) {
            if (n0 >= n1) continue;
            std::vector<float> got(ref.size(), -7.0f);
            t->matmul(x.data(), K, M, p, n0, n1, got.data(), N);
            INFO(t->name << " dtype " << dtype_name(dt) << " N " << N << " M " << M << " cols " << n0 << ".." << n1);
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                const std::size_t i = static_cast<std::size_t>(m * N + n);
                if (n >= n0 && n < n1) REQUIRE(std::memcmp(&got[i], &ref[i], 4) == 0);
                else REQUIRE(got[i] == -7.0f);  // nothing written outside the range
              }
          }
        }
      }
    }
  }
  // A matrix whose rows are not a multiple of eight wide stays row-major.
  RandomMatrix odd(DType::kBF16, 9, 67, rng);
  PanelStore store;
  CHECK_FALSE(store.pack(odd.m).panels);
}

TEST_CASE("AVX-512, AVX2 and scalar kernels agree bit for bit, whatever the shape", "[kernels]") {
  const KernelTable* avx2 = avx2_kernels();
  if (!avx2) {
    WARN("this CPU has no AVX2/FMA/F16C: only the scalar table runs here");
    return;
  }
  const KernelTable& scalar = scalar_kernels();
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t K : {8, 64, 67, 1000}) {
      for (int64_t M : {1, 3, 4, 5, 17}) {
        const int64_t N = 13;
        RandomMatrix w(dt, N, K, rng);
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (auto& v : x) v = u(rng);
        std::vector<float> ya(static_cast<std::size_t>(M * N)), ys(ya.size());
        avx2->matmul(x.data(), K, M, w.m, 0, N, ya.data(), N);
        scalar.matmul(x.data(), K, M, w.m, 0, N, ys.data(), N);
        INFO("dtype " << dtype_name(dt) << " K " << K << " M " << M);
        REQUIRE(std::memcmp(ya.data(), ys.data(), ya.size() * 4) == 0);
        if (const KernelTable* avx512 = avx512_kernels()) {
          std::vector<float> y5(ya.size());
          avx512->matmul(x.data(), K, M, w.m, 0, N, y5.data(), N);
          REQUIRE(std::memcmp(y5.data(), ys.data(), ya.size() * 4) == 0);
        }
        // A row alone, or a column range on its own, gives the same bits.
        std::vector<float> one(static_cast<std::size_t>(N));
        avx2->matmul(x.data() + (M - 1) * K, K, 1, w.m, 0, N, one.data(), N);
        REQUIRE(std::memcmp(one.data(), ya.data() + (M - 1) * N, one.size() * 4) == 0);
        std::vector<float> part(static_cast<std::size_t>(M * N), 0.0f);
        avx2->matmul(x.data(), K, M, w.m, 5, 9, part.data(), N);
        for (int64_t m = 0; m < M; ++m)
          for (int64_t n = 5; n < 9; ++n) REQUIRE(part[m * N + n] == ya[m * N + n]);
      }
    }
  }
  std::vector<float> a(1003), b(1003), y1(1003), y2(1003);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = u(rng), b[i] = u(rng), y1[i] = y2[i] = u(rng);
  CHECK(avx2->dot(a.data(), b.data(), 1003) == scalar.dot(a.data(), b.data(), 1003));
  avx2->axpy(0.37f, a.data(), y1.data(), 1003);
  scalar.axpy(0.37f, a.data(), y2.data(), 1003);
  CHECK(y1 == y2);

  // The attention kernels against the loops they stand for, on every table,
  // for several queries at once (strided as in the model) and resumed sums,
  // with float32 and half-width (bf16, f16) KV rows: the reference is the
  // float loop on the rows widened.
  std::vector<const KernelTable*> tables{avx2, &scalar};
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  for (DType kv : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {16, 20, 64, 128, 136}) {
      for (int64_t count : {1, 3, 4, 9, 14, 130}) {
        const std::size_t es = dtype_size(kv);
        std::vector<std::vector<uint8_t>> rows(static_cast<std::size_t>(count), std::vector<uint8_t>(static_cast<std::size_t>(n) * es));
        std::vector<std::vector<float>> wide(static_cast<std::size_t>(count), std::vector<float>(static_cast<std::size_t>(n)));
        std::vector<const void*> ptrs;
        std::vector<const float*> wide_ptrs;
        for (std::size_t r = 0; r < rows.size(); ++r) {
          for (int64_t i = 0; i < n; ++i) {
            const float v = u(rng);
            const uint16_t h = kv == DType::kBF16 ? f32_to_bf16(v) : f32_to_f16(v);
            if (kv == DType::kF32) std::memcpy(rows[r].data() + 4 * i, &v, 4);
            else std::memcpy(rows[r].data() + 2 * i, &h, 2);
            wide[r][static_cast<std::size_t>(i)] = load_as_f32(rows[r].data(), kv, static_cast<std::size_t>(i));
          }
          ptrs.push_back(rows[r].data());
          wide_ptrs.push_back(wide[r].data());
        }
        for (int64_t M : {1, 2, 3, 5, 6, 7, 13}) {
          const int64_t ldq = n + 3, ldo = count + 2, ldw = count + 1;
          std::vector<float> q(static_cast<std::size_t>(M * ldq)), w(static_cast<std::size_t>(M * ldw));
          for (auto& v : q) v = u(rng);
          for (auto& v : w) v = u(rng);
          for (const KernelTable* t : tables) {
            INFO(t->name << " kv " << dtype_name(kv) << " n " << n << " count " << count << " M " << M);
            std::vector<float> scores(static_cast<std::size_t>(M * ldo), -5.0f);
            t->dot_rows(q.data(), ldq, M, kv, ptrs.data(), count, n, scores.data(), ldo);
            for (int64_t m = 0; m < M; ++m) {
              for (int64_t r = 0; r < count; ++r) REQUIRE(scores[m * ldo + r] == scalar.dot(q.data() + m * ldq, wide_ptrs[r], n));
              REQUIRE(scores[m * ldo + count] == -5.0f);
            }
            // Sums over all rows at once, and split in two calls (the second accumulating).
            const int64_t ld_out = n + 5, split = count / 3;
            std::vector<float> sum(static_cast<std::size_t>(M * ld_out), 123.0f), sum2 = sum;
            t->weighted_sum(w.data(), ldw, M, kv, ptrs.data(), count, n, false, sum.data(), ld_out);
            t->weighted_sum(w.data(), ldw, M, kv, ptrs.data(), split, n, false, sum2.data(), ld_out);
            t->weighted_sum(w.data() + split, ldw, M, kv, ptrs.data() + split, count - split, n, true, sum2.data(), ld_out);
            for (int64_t m = 0; m < M; ++m) {
              std::vector<float> ref(static_cast<std::size_t>(n), 0.0f);
              for (int64_t r = 0; r < count; ++r) scalar.axpy(w[m * ldw + r], wide_ptrs[r], ref.data(), n);
              for (int64_t i = 0; i < n; ++i) {
                REQUIRE(std::memcmp(&sum[m * ld_out + i], &ref[i], 4) == 0);
                REQUIRE(std::memcmp(&sum2[m * ld_out + i], &ref[i], 4) == 0);
              }
              for (int64_t i = n; i < ld_out && m + 1 < M; ++i) REQUIRE(sum[m * ld_out + i] == 123.0f);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("bf16 and f16 conversions round to nearest even", "[kernels]") {
  CHECK(bf16_to_f32(f32_to_bf16(1.0f)) == 1.0f);
  CHECK(f32_to_bf16(1.00390625f) == 0x3F80);  // exactly halfway: to even
  CHECK(f32_to_bf16(1.01171875f) == 0x3F82);
  CHECK(f16_to_f32(f32_to_f16(0.333251953125f)) == 0.333251953125f);
  CHECK(f16_to_f32(0x7BFF) == 65504.0f);
  CHECK(f16_to_f32(0x0001) == std::ldexp(1.0f, -24));
  for (uint32_t h = 0; h < 0x7C00; ++h) REQUIRE(f32_to_f16(f16_to_f32(static_cast<uint16_t>(h))) == h);
}

// What tensor parallelism's bitwise promise rests on (row_parallel.h): a
// group of width tp gives each rank 8 / tp of the row-parallel product's
// column chunks; each rank adds its chunks' partials as the subtree they
// form, and the group adds the ranks' subtrees in the same tree. The result
// must be the width-1 result, bit for bit, on every kernel table, for any
// K (chunks need not be multiples of 8), in either weight layout.
TEST_CASE("a row-parallel product split over 1, 2, 4 or 8 ranks sums to the same bits", "[kernels][tp]") {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  if (avx2_kernels()) tables.push_back(avx2_kernels());
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  bool some_order_differs = false;  // the order matters at all (else this test could not fail)
  for (DType dt : {DType::kF32, DType::kBF16}) {
    for (int64_t K : {64, 72, 200, 1024}) {
      const int64_t N = 40, M = 5;
      RandomMatrix w(dt, N, K, rng);
      std::vector<float> x(static_cast<std::size_t>(M * K));
      for (float& v : x) v = u(rng);
      PanelStore store;
      const auto chunks = split_columns(w.m, 0, kReduceChunks, store);
      for (const KernelTable* t : tables) {
        std::vector<float> reference;
        for (int tp : {1, 2, 4, 8}) {
          const int per = kReduceChunks / tp;
          std::vector<std::vector<float>> subtrees;  // each rank's, [M][N]
          for (int r = 0; r < tp; ++r) {
            std::vector<std::vector<float>> buffers(4);
            TreeSum tree(buffers, M, N, 0, N);
            for (int c = r * per; c < (r + 1) * per; ++c) {
              t->matmul(x.data() + chunk_begin(K, c), K, M, chunks[static_cast<std::size_t>(c)], 0, N, tree.next(), N);
              tree.push();
            }
            subtrees.emplace_back(tree.result(), tree.result() + M * N);
          }
          std::vector<const float*> parts;
          for (const auto& s : subtrees) parts.push_back(s.data());
          std::vector<std::vector<float>> buffers(4);
          std::vector<float> got(static_cast<std::size_t>(M * N));
          sum_in_tree(parts, M * N, got.data(), buffers);
          if (tp == 1) reference = got;
          if (tp == 8) {  // the same partials added left to right: another order, other bits somewhere
            std::vector<float> seq(subtrees[0]);
            for (int r = 1; r < tp; ++r)
              for (std::size_t i = 0; i < seq.size(); ++i) seq[i] += subtrees[static_cast<std::size_t>(r)][i];
            some_order_differs = some_order_differs || std::memcmp(seq.data(), got.data(), seq.size() * 4) != 0;
          }
          INFO(t->name << " " << dtype_name(dt) << " K=" << K << " tp=" << tp);
          CHECK(std::memcmp(got.data(), reference.data(), got.size() * sizeof(float)) == 0);
        }
      }
    }
  }
  CHECK(some_order_differs);
}

TEST_CASE("the fused row-parallel kernel gives the bits of each part's matmul added in the tree", "[kernels][tp]") {
  // matmul_tree against matmul per part + TreeSum, on every table, for panel
  // parts (the fused AVX-512 path) and row-major ones, 1..8 parts, row counts
  // that make every tile height, column ranges inside panels.
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  if (avx2_kernels()) tables.push_back(avx2_kernels());
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t K : {64, 200, 1024}) {  // 200: chunks of 25 columns, no panels
      const int64_t N = 44;
      RandomMatrix w(dt, N, K, rng);
      PanelStore store;
      const auto chunks = split_columns(w.m, 0, kReduceChunks, store);
      for (int count : {1, 2, 4, 8}) {
        const int64_t kc = chunk_begin(K, count);  // the parts' columns: chunks [0, count)
        for (int64_t M : {1, 2, 5, 6, 7, 12, 17, 40}) {
          std::vector<float> x(static_cast<std::size_t>(M * K));
          for (float& v : x) v = u(rng);
          std::vector<float> want(static_cast<std::size_t>(M * N));
          {
            std::vector<std::vector<float>> buffers(4);
            TreeSum tree(buffers, M, N, 0, N);
            for (int c = 0; c < count; ++c) {
              scalar_kernels().matmul(x.data() + chunk_begin(K, c), K, M, chunks[static_cast<std::size_t>(c)], 0, N,
                                      tree.next(), N);
              tree.push();
            }
            std::copy(tree.result(), tree.result() + M * N, want.begin());
          }
          for (const KernelTable* t : tables) {
            for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {8, 40}, {3, 29}}) {
              std::vector<float> got(want.size(), -7.0f);
              t->matmul_tree(x.data(), K, M, chunks.data(), count, n0, n1, got.data(), N);
              INFO(t->name << " " << dtype_name(dt) << " K=" << K << " parts=" << count << " M=" << M << " columns "
                           << n0 << ".." << n1 << " (" << kc << " of x's columns)");
              for (int64_t m = 0; m < M; ++m) {
                for (int64_t n = 0; n < N; ++n) {
                  const float g = got[static_cast<std::size_t>(m * N + n)];
                  const float e = n >= n0 && n < n1 ? want[static_cast<std::size_t>(m * N + n)] : -7.0f;
                  REQUIRE(std::memcmp(&g, &e, 4) == 0);
                }
              }
            }
          }
        }
      }
    }
  }
}

namespace {

// kBf16Dot as kernels.h states it, one output at a time: x rounded to bf16
// (a subnormal to 0), 4 lanes, each k-group's odd element of a lane's pair
// first, every step an FMA of exact products with subnormal results flushed
// to signed zero, the lanes folded (l0 + l2) + (l1 + l3).
float flush(float v) { return std::fpclassify(v) == FP_SUBNORMAL ? std::copysign(0.0f, v) : v; }

float bf16dot(const float* x, const Matrix& w, int64_t n, int64_t k0, int64_t K) {
  float lane[4] = {0, 0, 0, 0};
  for (int64_t g = 0; g < K; g += 8) {
    for (int j = 0; j < 4; ++j) {
      for (const int64_t k : {g + 2 * j + 1, g + 2 * j}) {
        const float xv = flush(bf16_to_f32(f32_to_bf16(flush(x[k]))));
        lane[j] = flush(std::fma(xv, flush(w.at(n, k0 + k)), lane[j]));
      }
    }
  }
  return (lane[0] + lane[2]) + (lane[1] + lane[3]);
}

}  // namespace

TEST_CASE("the bf16 dot-product table computes exactly the arithmetic kernels.h states", "[kernels]") {
  const KernelTable* t = avx512_bf16_kernels();
  if (!t) {
    WARN("no AVX512-BF16 on this CPU: the bf16 dot-product table is not checked here");
    return;
  }
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t K : {8, 64, 200 / 8 * 8, 1024}) {
    for (int64_t N : {8, 13, 40}) {
      RandomMatrix raw(DType::kBF16, N, K, rng);
      PanelStore store;
      const Matrix w = store.pack(raw.m);
      REQUIRE(w.panels);
      for (int64_t M : {1, 3, 6, 7, 13}) {
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (float& v : x) v = u(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
        x[0] = 1e-39f;  // a subnormal activation: 0, as vcvtneps2bf16 makes it
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {3, N - 1}, {N / 2, N / 2 + 1}}) {
          std::vector<float> got(static_cast<std::size_t>(M * N), -7.0f);
          t->matmul(x.data(), K, M, w, n0, n1, got.data(), N);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const float want = n >= n0 && n < n1 ? bf16dot(x.data() + m * K, w, n, 0, K) : -7.0f;
              const float g = got[static_cast<std::size_t>(m * N + n)];
              INFO("K=" << K << " N=" << N << " M=" << M << " m=" << m << " n=" << n << " of " << n0 << ".." << n1);
              REQUIRE(std::memcmp(&g, &want, 4) == 0);
            }
          }
        }
      }
      // The row-parallel product: the 8 chunks' bf16 dot products in the fixed tree.
      if (K % 64 == 0) {
        const auto chunks = split_columns(raw.m, 0, kReduceChunks, store);
        for (int64_t M : {1, 7}) {
          std::vector<float> x(static_cast<std::size_t>(M * K));
          for (float& v : x) v = u(rng);
          std::vector<float> got(static_cast<std::size_t>(M * N));
          t->matmul_tree(x.data(), K, M, chunks.data(), kReduceChunks, 0, N, got.data(), N);
          for (int64_t m = 0; m < M; ++m) {
            for (int64_t n = 0; n < N; ++n) {
              const float want = test::chunk_tree([&](int c) {
                return bf16dot(x.data() + m * K + chunk_begin(K, c), raw.m, n, chunk_begin(K, c), K / kReduceChunks);
              });
              const float g = got[static_cast<std::size_t>(m * N + n)];
              INFO("tree K=" << K << " N=" << N << " M=" << M << " m=" << m << " n=" << n);
              REQUIRE(std::memcmp(&g, &want, 4) == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("8-bit matrices compute on code x scale: the bits of the f32 matrix of those values, every table and layout",
          "[kernels][quant]") {
  std::mt19937 rng(17);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  if (avx2_kernels()) tables.push_back(avx2_kernels());
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  if (avx512_gfni_kernels()) tables.push_back(avx512_gfni_kernels());  // FP8 register tiles of its own
  std::vector<const KernelTable*> tree_tables = tables;  // the bf16 table has its own contract for 8-bit (below)
  const int64_t N = 44, K = 320;  // 2.5 blocks of 128
  // block grids: FP8 128 x 128 (partial blocks), per channel, per tensor, 16 x 24 blocks, and 5 x 12 (columns
  // blocks not on multiples of 8: the reference path)
  // (the last two: channel scales of 64..1024, past where the AVX-512 reader folds 2^120 into FP8 scales; and
  // 2^120..2^121 with codes of at most 2^-6, products near the top of the floats)
  const std::vector<std::pair<int64_t, int64_t>> grids{{128, 128}, {1, K}, {N, K}, {16, 24}, {5, 12}, {1, K}, {1, K}};
  for (DType dt : {DType::kF8E4M3, DType::kI8}) {
    for (std::size_t gi = 0; gi < grids.size(); ++gi) {
      const auto [br, bc] = grids[gi];
      const bool big = gi + 2 == grids.size(), huge = gi + 1 == grids.size();
      if (huge && dt != DType::kF8E4M3) continue;
      QuantMatrix w(dt, N, K, br, bc, rng, big ? 64.0f : huge ? 0x1p120f : 1e-4f,
                    big ? 1024.0f : huge ? 0x1p121f : 1e-2f, huge ? 0x1p-6f : 1e9f);
      PanelStore store;
      for (const auto& c : test::layout_cases(w.q, store)) {
        const int64_t n = c.q.rows, k = c.q.cols;
        std::vector<float> sub(static_cast<std::size_t>(n * k));
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < k; ++j) sub[static_cast<std::size_t>(i * k + j)] = w.f.at(c.r0 + i, c.k0 + j);
        const Matrix f{sub.data(), DType::kF32, n, k, false, {}};
        for (int64_t i = 0; i < n; ++i)
          for (int64_t j = 0; j < k; ++j) REQUIRE(c.q.at(i, j) == f.at(i, j));
        for (int64_t M : {1, 2, 3, 5, 9, 16, 17}) {
          std::vector<float> x(static_cast<std::size_t>(M * k));
          for (float& v : x) v = u(rng);
          std::vector<float> want(static_cast<std::size_t>(M * n));
          scalar_kernels().matmul(x.data(), k, M, f, 0, n, want.data(), n);
          for (const KernelTable* t : tables) {
            for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, n}, {3, n - 2}, {8, 16}}) {
              std::vector<float> got(want.size(), -7.0f);
              t->matmul(x.data(), k, M, c.q, n0, n1, got.data(), n);
              INFO(t->name << " " << dtype_name(dt) << " blocks " << br << "x" << bc << " " << c.what << " M=" << M
                           << " columns " << n0 << ".." << n1);
              for (int64_t m = 0; m < M; ++m)
                for (int64_t j = 0; j < n; ++j) {
                  const float g = got[static_cast<std::size_t>(m * n + j)];
                  const float e = j >= n0 && j < n1 ? want[static_cast<std::size_t>(m * n + j)] : -7.0f;
                  REQUIRE(std::memcmp(&g, &e, 4) == 0);
                }
            }
          }
        }
      }
      // The row-parallel product over 8-bit column chunks: the tree of the f32 chunks' products.
      const auto qchunks = split_columns(w.q, 0, kReduceChunks, store);
      const auto fchunks = split_columns(w.f, 0, kReduceChunks, store);
      for (int64_t M : {1, 9}) {
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (float& v : x) v = u(rng);
        std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size());
        scalar_kernels().matmul_tree(x.data(), K, M, fchunks.data(), kReduceChunks, 0, N, want.data(), N);
        for (const KernelTable* t : tree_tables) {
          t->matmul_tree(x.data(), K, M, qchunks.data(), kReduceChunks, 0, N, got.data(), N);
          INFO(t->name << " tree " << dtype_name(dt) << " blocks " << br << "x" << bc << " M=" << M);
          REQUIRE(std::memcmp(got.data(), want.data(), 4 * want.size()) == 0);
        }
      }
    }
  }
}

TEST_CASE("an FP8 NaN code is refused when its matrix is copied for use, naming the place", "[kernels][quant]") {
  std::mt19937 rng(3);
  QuantMatrix w(DType::kF8E4M3, 16, 32, 128, 128, rng);
  const std::string name = "model.layers.0.mlp.up_proj.weight";
  w.q.scales.name = &name;
  w.codes[static_cast<std::size_t>(9 * 32 + 20)] = 0xFF;
  PanelStore store;
  CHECK_THROWS_WITH(store.pack(w.q), Catch::Contains("'model.layers.0.mlp.up_proj.weight' holds an FP8 NaN (byte 0xFF) "
                                                     "at row 9, column 20"));
  CHECK_THROWS_WITH(store.pack_slice(w.q, 8, 16, 16, 32), Catch::Contains("at row 9, column 20"));
  CHECK_NOTHROW(store.pack_slice(w.q, 0, 8, 0, 32));
}

TEST_CASE("the bf16 dot-product table takes an 8-bit matrix's values rounded to bf16 (nearest even, subnormals to 0)",
          "[kernels][quant]") {
  if (!avx512_bf16_kernels()) return;  // no AVX512-BF16 here: nothing to hold to its contract
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> u(-1, 1);
  const int64_t N = 44, K = 320;
  for (DType dt : {DType::kF8E4M3, DType::kI8}) {
    for (auto [br, bc] : {std::pair<int64_t, int64_t>{128, 128}, {1, K}}) {
      QuantMatrix w(dt, N, K, br, bc, rng, br == 1 ? 1e-40f : 1e-4f, br == 1 ? 1e-2f : 1e-2f);  // some values subnormal
      std::vector<uint16_t> rounded(w.values.size());
      for (std::size_t i = 0; i < rounded.size(); ++i) rounded[i] = f32_to_bf16(flush(w.values[i]));
      PanelStore store;
      const Matrix q = store.pack(w.q), b = store.pack(Matrix{rounded.data(), DType::kBF16, N, K, false, {}});
      for (int64_t M : {1, 3, 6, 7, 16, 40}) {
        std::vector<float> x(static_cast<std::size_t>(M * K));
        for (float& v : x) v = u(rng);
        for (auto [n0, n1] : {std::pair<int64_t, int64_t>{0, N}, {3, 29}}) {
          std::vector<float> want(static_cast<std::size_t>(M * N), -7.0f), got(want.size(), -7.0f);
          avx512_bf16_kernels()->matmul(x.data(), K, M, b, n0, n1, want.data(), N);
          avx512_bf16_kernels()->matmul(x.data(), K, M, q, n0, n1, got.data(), N);
          INFO(dtype_name(dt) << " blocks " << br << "x" << bc << " M=" << M << " columns " << n0 << ".." << n1);
          REQUIRE(std::memcmp(got.data(), want.data(), 4 * want.size()) == 0);
        }
        // The row-parallel product over 8-bit column chunks: the same tree over the bf16 chunks' products.
        const auto qchunks = split_columns(w.q, 0, kReduceChunks, store);
        const auto bchunks = split_columns(Matrix{rounded.data(), DType::kBF16, N, K, false, {}}, 0, kReduceChunks, store);
        std::vector<float> want(static_cast<std::size_t>(M * N)), got(want.size());
        matmul_tree_by_parts(*avx512_bf16_kernels(), x.data(), K, M, bchunks.data(), kReduceChunks, 0, N, want.data(), N);
        avx512_bf16_kernels()->matmul_tree(x.data(), K, M, qchunks.data(), kReduceChunks, 0, N, got.data(), N);
        INFO(dtype_name(dt) << " tree, M=" << M);
        REQUIRE(std::memcmp(got.data(), want.data(), 4 * want.size()) == 0);
      }
    }
  }
}
