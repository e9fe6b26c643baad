#include <catch2/catch.hpp>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/cpu/kernels.h"

using namespace tandem::runtime::cpu;

TEST_CASE("attention's softmax is one arithmetic: every table gives the scalar statement's bits", "[kernels]") {
  SECTION("exp_fixed is within 2 ulp of exp over [-87, 0], exact at 0, and reaches the subnormals and 0") {
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> u(-87.0f, 0.0f);
    for (int i = 0; i < 200000; ++i) {
      const float d = i < 1000 ? -static_cast<float>(i) * 0.087f : u(rng);
      const double want = std::exp(static_cast<double>(d));
      const double ulp = std::nextafter(static_cast<float>(want), INFINITY) - static_cast<float>(want);
      INFO("d = " << d);
      REQUIRE(std::fabs(exp_fixed(d) - want) <= 2.0 * ulp);
    }
    CHECK(exp_fixed(0.0f) == 1.0f);
    CHECK(exp_fixed(-0.0f) == 1.0f);
    CHECK(exp_fixed(-100.0f) > 0.0f);
    CHECK(exp_fixed(-100.0f) < 1e-38f);  // a subnormal
    CHECK(exp_fixed(-1000.0f) == 0.0f);
    CHECK(exp_fixed(-INFINITY) == 0.0f);
    CHECK(std::isnan(exp_fixed(NAN)));
  }
  std::vector<const KernelTable*> tables{&scalar_kernels()};
  if (avx2_kernels()) tables.push_back(avx2_kernels());
  if (avx512_kernels()) tables.push_back(avx512_kernels());
  if (avx512_bf16_kernels()) tables.push_back(avx512_bf16_kernels());
  std::mt19937 rng(9);
  for (const int64_t n : {1, 2, 7, 15, 16, 17, 31, 33, 100, 1000, 4099, 70001}) {
    for (const float spread : {0.01f, 3.0f, 60.0f, 2000.0f}) {  // 2000: most weights underflow to 0 or subnormals
      std::normal_distribution<float> g(0.0f, spread);
      std::vector<float> scores(static_cast<std::size_t>(n));
      for (auto& v : scores) v = g(rng);
      std::vector<float> want = scores;
      softmax_scalar(want.data(), n, 0.125f);
      double total = 0;
      for (float w : want) total += w;
      INFO("n " << n << " spread " << spread);
      REQUIRE(std::fabs(total - 1.0) < 1e-5);
      for (const KernelTable* t : tables) {
        std::vector<float> got = scores;
        t->softmax(got.data(), n, 0.125f);
        INFO(t->name);
        REQUIRE(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
      }
    }
  }
  SECTION("scores of -inf (positions not seen) and a NaN score give the scalar statement's bits too") {
    std::vector<float> scores(40, 0.5f);
    for (std::size_t j = 0; j < scores.size(); j += 3) scores[j] = -INFINITY;
    for (const bool nan : {false, true}) {
      if (nan) scores[17] = NAN;
      std::vector<float> want = scores;
      softmax_scalar(want.data(), 40, 0.125f);
      for (const KernelTable* t : tables) {
        std::vector<float> got = scores;
        t->softmax(got.data(), 40, 0.125f);
        INFO(t->name << (nan ? ", a NaN score" : ""));
        CHECK(std::memcmp(got.data(), want.data(), want.size() * 4) == 0);
      }
    }
  }
  SECTION("the weights are exp(x - max) / sum in the stated order, as a plain loop computes them") {
    std::vector<float> s{1.0f, -2.0f, 0.5f, 3.0f, -7.0f};
    std::vector<float> x(s.size()), got = s;
    float max = -INFINITY;
    for (std::size_t j = 0; j < s.size(); ++j) max = std::max(max, x[j] = s[j] * 0.5f);
    float sum = 0;  // fewer than 16: every lane holds one term, the halving tree adds them
    std::vector<float> e(16, 0.0f);
    for (std::size_t j = 0; j < s.size(); ++j) e[j] = exp_fixed(x[j] - max);
    for (int w = 8; w >= 1; w /= 2)
      for (int i = 0; i < w; ++i) e[static_cast<std::size_t>(i)] += e[static_cast<std::size_t>(i + w)];
    sum = e[0];
    softmax_scalar(got.data(), 5, 0.5f);
    for (std::size_t j = 0; j < s.size(); ++j) CHECK(got[j] == exp_fixed(x[j] - max) / sum);
  }
}

TEST_CASE("the MLPs' SwiGLU is one arithmetic: AVX-512 gives the scalar statement's bits, close to silu", "[kernels]") {
  std::mt19937 rng(13);
  for (const int64_t n : {1, 15, 16, 17, 100, 3072}) {
    for (const float spread : {0.5f, 4.0f, 40.0f, 300.0f}) {  // 300: past exp_fixed's clamp at -104 both ways
      std::normal_distribution<float> d(0.0f, spread);
      std::vector<float> g(static_cast<std::size_t>(n)), u(g.size());
      for (std::size_t i = 0; i < g.size(); ++i) {
        g[i] = d(rng);
        u[i] = d(rng) / spread;
      }
      if (n >= 16) {  // the edges: signed zeros, infinities, NaN, subnormals, the largest floats
        const float edge[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-40f, 3e38f, -3e38f, 88.0f, -88.0f};
        for (std::size_t i = 0; i < std::size(edge); ++i) g[i] = edge[i];
      }
      std::vector<float> want = g;
      swiglu_scalar(want.data(), u.data(), n);
      for (int64_t i = 0; i < n; ++i) {  // silu(x) x u in double: within 4 ulp (or both tiny, or both not finite)
        const double x = g[static_cast<std::size_t>(i)], y = x / (1.0 + std::exp(-x)) * u[static_cast<std::size_t>(i)];
        const float got = want[static_cast<std::size_t>(i)];
        INFO("x = " << x << " u = " << u[static_cast<std::size_t>(i)] << " got " << got << " want " << y);
        if (std::isnan(y)) {
          CHECK(std::isnan(got));
          continue;
        }
        if (std::fabs(y) > 3.4028234663852886e38) {  // past float32: an infinity of its sign
          CHECK((std::isinf(got) && std::signbit(got) == std::signbit(y)));
          continue;
        }
        const double ulp = std::nextafter(std::fabs(static_cast<float>(y)), INFINITY) - std::fabs(static_cast<float>(y));
        CHECK(std::fabs(got - y) <= std::max(4.0 * ulp, 1e-38));
      }
      INFO("n = " << n << " spread " << spread);
      for (std::size_t i = 0; i < want.size(); ++i)  // a NaN is the default quiet NaN
        if (std::isnan(want[i])) CHECK(std::bit_cast<uint32_t>(want[i]) == 0x7fc00000u);
      if (avx2_kernels()) {
        std::vector<float> got = g;
        swiglu_avx2(got.data(), u.data(), n);
        REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
      if (avx512_kernels()) {
        std::vector<float> got = g;
        swiglu_avx512(got.data(), u.data(), n);
        REQUIRE(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
      }
      std::vector<float> chosen = g;
      swiglu(chosen.data(), u.data(), n);
      REQUIRE(std::memcmp(chosen.data(), want.data(), want.size() * sizeof(float)) == 0);
    }
  }
}
