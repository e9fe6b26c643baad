#include "planner/machine.h"

#include <immintrin.h>

#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace tandem::planner {
namespace {

using Clock = std::chrono::steady_clock;

template <class F>
double timed_parallel(int threads, F body) {
  std::vector<std::thread> pool;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) pool.emplace_back(body, t);
  for (auto& t : pool) t.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Twelve independent accumulators, written out so they stay in registers
// (an array of vectors may be spilled and then measures store forwarding).
// Each starts from its own value: twelve chains from one value are twelve
// copies of one chain, which the compiler computes once (it did: this
// benchmark once timed a single latency-bound chain and called it the peak).
#define TANDEM_FMA12(FMA, V)                                                                      \
  V a0 = init, a1 = init + 1, a2 = init + 2, a3 = init + 3, a4 = init + 4, a5 = init + 5,          \
    a6 = init + 6, a7 = init + 7, a8 = init + 8, a9 = init + 9, a10 = init + 10, a11 = init + 11; \
  for (long k = 0; k < iters; ++k) {                                                                   \
    a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c);                  \
    a4 = FMA(a4, m, c), a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c);                  \
    a8 = FMA(a8, m, c), a9 = FMA(a9, m, c), a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);              \
  }

__attribute__((target("avx2,fma"))) double fma_avx2(long iters) {
  const __m256 init = _mm256_set1_ps(1.0f), m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
  TANDEM_FMA12(_mm256_fmadd_ps, __m256)
  const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)),
                                               _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11))));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0];
}

__attribute__((target("avx512f"))) double fma_avx512(long iters) {
  const __m512 init = _mm512_set1_ps(1.0f), m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  TANDEM_FMA12(_mm512_fmadd_ps, __m512)
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                               _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}
#undef TANDEM_FMA12

// Twelve vdpbf16ps chains, each from its own value (see TANDEM_FMA12).
__attribute__((target("avx512f,avx512bf16"))) double dot_bf16(long iters) {
  __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4),
         a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8),
         a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11), a11 = _mm512_set1_ps(12);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x2000);  // 1, ~1e-19
  for (long k = 0; k < iters; ++k) {
    a0 = _mm512_dpbf16_ps(a0, x, y), a1 = _mm512_dpbf16_ps(a1, x, y), a2 = _mm512_dpbf16_ps(a2, x, y);
    a3 = _mm512_dpbf16_ps(a3, x, y), a4 = _mm512_dpbf16_ps(a4, x, y), a5 = _mm512_dpbf16_ps(a5, x, y);
    a6 = _mm512_dpbf16_ps(a6, x, y), a7 = _mm512_dpbf16_ps(a7, x, y), a8 = _mm512_dpbf16_ps(a8, x, y);
    a9 = _mm512_dpbf16_ps(a9, x, y), a10 = _mm512_dpbf16_ps(a10, x, y), a11 = _mm512_dpbf16_ps(a11, x, y);
  }
  const __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                                 _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
                                               _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11))));
  float out[16];
  _mm512_storeu_ps(out, s);
  return out[0];
}

}  // namespace

bool cpu_has_avx512() { return __builtin_cpu_supports("avx512f"); }

double triad_gbps(int threads) {
  const std::size_t n = std::size_t{1} << 25;  // 32 Mi floats = 128 MiB per array
  std::unique_ptr<float[]> a(new float[n]), b(new float[n]), c(new float[n]);
  timed_parallel(threads, [&](int t) {  // first touch by the thread that will use the pages
    const std::size_t lo = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
    const std::size_t hi = n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
    for (std::size_t i = lo; i < hi; ++i) a[i] = 0, b[i] = 1, c[i] = 2;
  });
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    best = std::min(best, timed_parallel(threads, [&](int t) {
      const std::size_t lo = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
      const std::size_t hi = n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
      float* __restrict pa = a.get();
      const float* __restrict pb = b.get();
      const float* __restrict pc = c.get();
      for (std::size_t i = lo; i < hi; ++i) pa[i] = pb[i] + 3.0f * pc[i];
    }));
  }
  volatile float sink = a[n / 2];
  (void)sink;
  return 3.0 * 4.0 * static_cast<double>(n) / best / 1e9;
}

__attribute__((target("avx2"))) float sum_avx2(const float* p, std::size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (std::size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0] + out[7];
}

double read_gbps(int threads) {
  const std::size_t n = std::size_t{3} << 25;  // 96 Mi floats = 384 MiB, as the triad's three arrays
  std::unique_ptr<float[]> a(new float[n]);
  std::vector<float> sink(static_cast<std::size_t>(threads));
  auto part = [&](int t, std::size_t& lo, std::size_t& hi) {
    lo = n * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads) / 32 * 32;
    hi = n * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads) / 32 * 32;
  };
  timed_parallel(threads, [&](int t) {
    std::size_t lo, hi;
    part(t, lo, hi);
    for (std::size_t i = lo; i < hi; ++i) a[i] = 1.0f;
  });
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    best = std::min(best, timed_parallel(threads, [&](int t) {
      std::size_t lo, hi;
      part(t, lo, hi);
      sink[static_cast<std::size_t>(t)] = sum_avx2(a.get() + lo, hi - lo);
    }));
  }
  volatile float keep = sink[0];
  (void)keep;
  return 4.0 * static_cast<double>(n / 32 * 32) / best / 1e9;
}

double fma_peak_gflops(int threads, bool avx512) {
  const long iters = 50'000'000;
  std::vector<double> sink(static_cast<std::size_t>(threads));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    best = std::min(best, timed_parallel(threads, [&](int t) {
      sink[static_cast<std::size_t>(t)] = avx512 ? fma_avx512(iters) : fma_avx2(iters);
    }));
  }
  const double lanes = avx512 ? 16 : 8;
  return 2.0 * lanes * 12.0 * static_cast<double>(iters) * threads / best / 1e9;
}

double bf16_dot_peak_gflops(int threads) {
  if (!__builtin_cpu_supports("avx512bf16")) return 0;
  const long iters = 50'000'000;
  std::vector<double> sink(static_cast<std::size_t>(threads));
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    best = std::min(best, timed_parallel(threads, [&](int t) { sink[static_cast<std::size_t>(t)] = dot_bf16(iters); }));
  }
  return 4.0 * 16 * 12.0 * static_cast<double>(iters) * threads / best / 1e9;
}

}  // namespace tandem::planner

namespace tandem::planner {

HardwareProfile measure_cpu_profile(int threads, double memory_bytes) {
  HardwareProfile h;
  h.name = "cpu";
  const bool avx512 = cpu_has_avx512();
  h.peak_flops = fma_peak_gflops(threads, avx512) * 1e9;
  h.hbm_bytes_per_s = triad_gbps(threads) * 1e9;
  h.hbm_bytes = memory_bytes;
  h.kv_memory_fraction = 1.0;
  h.link_bytes_per_s = h.hbm_bytes_per_s / 2;  // one copy between ranks' memory on a node
  h.link_latency_s = 20e-6;
  h.reload_bytes_per_s = h.hbm_bytes_per_s / 2;  // a shard copied out of the checkpoint's mapping: one copy
  // What our kernels reach of those (perf/engine_bench on the development
  // machine): ~55% of the FMA peak in prefill, ~90% of the triad in decode.
  h.mfu = 0.55;
  h.mbu = 0.9;
  h.step_overhead_s = 200e-6;
  return h;
}

}  // namespace tandem::planner
