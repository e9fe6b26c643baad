// The CUDA backend against the CPU reference: each op within a stated
// tolerance, the whole model's logits, and greedy tokens over 32 steps in
// float32. Needs a GPU: without one it prints why and exits 77, which ctest
// reports as skipped.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/devices.h"
#include "runtime/cuda/ops.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/engine/sampling.h"
#include "../unit/runtime/test_model.h"
#include "gpu_helpers.h"

using namespace tandem;
using namespace tandem::runtime;
namespace cu = tandem::runtime::cuda;
using tandem::testing::Dev;
using tandem::testing::DevPool;
using tandem::testing::random_floats;
using tandem::testing::rel_err;

namespace {

// Attention of each row over its sequence's positions [first, pos] in double
// precision, from a host image of the pool: the reference for both kernels.
std::vector<float> reference_attention(const std::vector<float>& q, const std::vector<float>& pool, const kv::KvLayout& L,
                                       int64_t layer, int64_t heads, const std::vector<int32_t>& tables,
                                       const std::vector<int32_t>& table_of, const std::vector<int32_t>& positions,
                                       int64_t window) {
  const int64_t rows = static_cast<int64_t>(positions.size()), hd = L.head_dim, kvh = L.kv_heads, bs = L.block_size;
  std::vector<float> want(static_cast<std::size_t>(rows * heads * hd));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t g = h / (heads / kvh), pos = positions[r];
      const int64_t first = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
      std::vector<double> s(static_cast<std::size_t>(pos + 1), 0.0);
      double mx = -1e300, sum = 0;
      for (int64_t t = first; t <= pos; ++t) {
        const int64_t blk = tables[table_of[r] + t / bs];
        double d = 0;
        for (int64_t i = 0; i < hd; ++i) d += q[(r * heads + h) * hd + i] * pool[L.offset(blk, layer, 0, g, t % bs) + i];
        s[t] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[t]);
      }
      for (int64_t t = first; t <= pos; ++t) sum += (s[t] = std::exp(s[t] - mx));
      for (int64_t i = 0; i < hd; ++i) {
        double o = 0;
        for (int64_t t = first; t <= pos; ++t)
          o += s[t] / sum * pool[L.offset(tables[table_of[r] + t / bs], layer, 1, g, t % bs) + i];
        want[(r * heads + h) * hd + i] = static_cast<float>(o);
      }
    }
  return want;
}

// A pool image in bf16 (round to nearest even), and back to float.
std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

}  // namespace

// A test case that runs past TANDEM_GPU_TEST_TIMEOUT seconds (default 240)
// ends the process with its name and exit 124: a kernel that hangs the GPU
// (or a group's threads waiting on each other) then costs one test's time
// and says where, instead of the whole device run saying nothing.
namespace {

struct Watch {
  std::mutex m;
  std::condition_variable cv;
  std::string name;  // the running test case; empty between them
  std::chrono::steady_clock::time_point since;
};
Watch& watch() {
  static Watch w;
  return w;
}

struct WatchdogListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    TestEventListenerBase::testCaseStarting(info);
    std::lock_guard<std::mutex> lock(watch().m);
    watch().name = info.name;
    watch().since = std::chrono::steady_clock::now();
  }
  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    TestEventListenerBase::testCaseEnded(stats);
    std::lock_guard<std::mutex> lock(watch().m);
    watch().name.clear();
  }
};
CATCH_REGISTER_LISTENER(WatchdogListener)

void start_watchdog() {
  const char* env = std::getenv("TANDEM_GPU_TEST_TIMEOUT");
  const auto limit = std::chrono::seconds(env && std::atoi(env) > 0 ? std::atoi(env) : 240);
  std::thread([limit] {
    Watch& w = watch();
    std::unique_lock<std::mutex> lock(w.m);
    for (;;) {
      w.cv.wait_for(lock, std::chrono::seconds(1));  // woken by nothing: a poll a second, no spinning
      if (!w.name.empty() && std::chrono::steady_clock::now() - w.since > limit) {
        std::fprintf(stderr, "TIMEOUT: test case \"%s\" ran past %lld s (TANDEM_GPU_TEST_TIMEOUT); stopping\n",
                     w.name.c_str(), static_cast<long long>(limit.count()));
        std::fflush(stdout);
        std::fflush(stderr);
        std::_Exit(124);
      }
    }
  }).detach();
}

}  // namespace

int main(int argc, char** argv) {
  if (cu::device_count() == 0) {
    std::printf("SKIP: the gpu tests need a CUDA device: %s\n", cu::devices_summary().c_str());
    return 77;
  }
  std::printf("%s\n", cu::devices_summary().c_str());
  start_watchdog();
  return Catch::Session().run(argc, argv) == 0 ? 0 : 1;  // never 77 (the skip code) for 77 failures
}

TEST_CASE("elementwise ops: exact", "[gpu]") {
  const int64_t rows = 5, n = 300;
  const auto x = random_floats(rows * n, 1), b = random_floats(rows * n, 2);
  Dev<float> dx(x), db(b);
  cu::add(dx.p, db.p, rows * n, nullptr);
  auto got = dx.get(x.size());
  for (int64_t i = 0; i < rows * n; ++i) CHECK(got[i] == x[i] + b[i]);
  // bf16 rounding: the same bits as the CPU's f32_to_bf16 (round to nearest even).
  Dev<uint16_t> halves(std::vector<uint16_t>(x.size()));
  cu::to_half(dx.p, rows * n, DType::kBF16, halves.p, nullptr);
  const auto h = halves.get(x.size());
  for (int64_t i = 0; i < rows * n; ++i) CHECK(h[i] == f32_to_bf16(got[i]));
  const std::vector<int32_t> pick = {4, 0, 2};
  Dev<int32_t> dpick(pick);
  Dev<float> out(std::vector<float>(3 * n));
  cu::gather_rows(dx.p, dpick.p, 3, n, out.p, nullptr);
  const auto g = out.get(3 * n);
  for (int64_t i = 0; i < n; ++i) CHECK(g[n + i] == got[i]);
  // argmax: the host sampler's greedy pick, ties to the lowest index.
  std::vector<float> rowsv(3 * 5000, -1.0f);
  rowsv[17] = 3.0f;
  rowsv[5000 + 4321] = 2.0f, rowsv[5000 + 99] = 2.0f;  // a tie
  rowsv[2 * 5000 + 4999] = 0.5f;
  Dev<float> dr(rowsv);
  Dev<int32_t> dpicked(std::vector<int32_t>(3));
  cu::argmax(dr.p, 3, 5000, dpicked.p, nullptr);
  CHECK(dpicked.get(3) == std::vector<int32_t>{17, 99, 4999});
}

// RMSNorm of one row of n, as the CPU: w * (x * 1 / sqrt(mean(x^2) + eps)).
void reference_norm(float* x, const float* w, int64_t n, float eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float inv = 1.0f / std::sqrt(static_cast<float>(ss) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) x[i] = w[i] * (x[i] * inv);
}

// Rotate-half RoPE of one head at `pos`, as the CPU: float angle, double cos/sin.
void reference_rope(float* v, int64_t hd, int32_t pos, const std::vector<float>& inv_freq) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const float a = static_cast<float>(pos) * inv_freq[i];
    const float c = static_cast<float>(std::cos(static_cast<double>(a))), s = static_cast<float>(std::sin(static_cast<double>(a)));
    const float p = v[i], q = v[i + hd / 2];
    v[i] = p * c - q * s;
    v[i + hd / 2] = q * c + p * s;
  }
}

TEST_CASE("draw: the token sample_token picks, for greedy and plain-temperature rows with min-p", "[gpu]") {
  for (const int64_t vocab : {int64_t{1000}, int64_t{151936}}) {
    INFO("vocab " << vocab);
    // Rows: spread logits, one dominant token, coarse values with ties, flat; all NaN; one +inf.
    constexpr int kRows = 6;
    std::vector<float> logits;
    for (int shape = 0; shape < kRows; ++shape) {
      auto row = random_floats(static_cast<std::size_t>(vocab), 40 + static_cast<uint32_t>(shape),
                               shape == 3 ? 0.3f : 3.0f);
      if (shape == 1) row[static_cast<std::size_t>(vocab / 3)] = 25.0f;
      if (shape == 2)
        for (auto& x : row) x = std::round(x);
      if (shape == 4) std::fill(row.begin(), row.end(), std::numeric_limits<float>::quiet_NaN());
      if (shape == 5) row[7] = std::numeric_limits<float>::infinity();
      logits.insert(logits.end(), row.begin(), row.end());
    }
    Dev<float> dlogits(logits);
    int compared = 0, not_argmax = 0;
    for (const float t : {0.0f, 0.5f, 1.0f, 1.5f})
      for (const float min_p : {0.0f, 0.05f})
        for (uint64_t key = 1; key <= 6; ++key) {
          std::vector<cu::DrawParams> params;
          for (int r = 0; r < kRows; ++r) params.push_back({t, min_p, counter_uniform(key * 7 + r, key)});
          Dev<cu::DrawParams> dparams(params);
          Dev<int32_t> dout(std::vector<int32_t>(kRows, -1));
          cu::draw(dlogits.p, kRows, vocab, dparams.p, dout.p, nullptr);
          const auto got = dout.get(kRows);
          for (int r = 0; r < kRows; ++r) {
            std::vector<float> row(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
            SamplingParams sp;
            sp.temperature = t, sp.min_p = min_p;
            const int32_t want = sample_token(row, sp, {}, {}, key * 7 + static_cast<uint64_t>(r), key);
            INFO("row " << r << " T " << t << " min_p " << min_p << " key " << key);
            CHECK(got[static_cast<std::size_t>(r)] == want);
            ++compared;
            const auto best = std::max_element(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
            if (r < 4) not_argmax += want != static_cast<int32_t>(best - (logits.begin() + r * vocab));
          }
        }
    CHECK(not_argmax > compared / 6);  // many draws are not simply the best token
    // A number just under 1: a token with a weight near the end of the row (none at all: 0, as the host).
    const double almost_one = std::nextafter(1.0, 0.0);
    Dev<cu::DrawParams> dlast(std::vector<cu::DrawParams>(kRows, cu::DrawParams{1.0f, 0.0f, almost_one}));
    Dev<int32_t> dout(std::vector<int32_t>(kRows, -1));
    cu::draw(dlogits.p, kRows, vocab, dlast.p, dout.p, nullptr);
    const auto got = dout.get(kRows);
    for (int r = 0; r < kRows; ++r) {
      INFO("u just under 1, row " << r);
      if (r < 4) CHECK(got[static_cast<std::size_t>(r)] > vocab / 2);
      else CHECK(got[static_cast<std::size_t>(r)] == 0);
    }
  }
}

TEST_CASE("add_rms_norm: the residual exact, the norm < 1e-5, its bf16 output the same value rounded", "[gpu]") {
  const int64_t rows = 7, n = 1000;  // n not a multiple of the block
  const auto x = random_floats(rows * n, 3), y = random_floats(rows * n, 12), bias = random_floats(n, 13),
             w = random_floats(n, 4);
  for (int variant = 0; variant < 3; ++variant) {  // plain norm; residual; residual + bias
    INFO("variant " << variant);
    const bool add = variant > 0, with_bias = variant == 2;
    std::vector<float> want_x = x;
    if (add)
      for (int64_t i = 0; i < rows * n; ++i) want_x[i] = x[i] + (with_bias ? y[i] + bias[i % n] : y[i]);
    std::vector<float> want = want_x;
    for (int64_t r = 0; r < rows; ++r) reference_norm(want.data() + r * n, w.data(), n, 1e-6f);
    Dev<float> dx(x), dy(y), db(bias), dw(w), dout(std::vector<float>(x.size()));
    cu::add_rms_norm(dx.p, add ? dy.p : nullptr, with_bias ? db.p : nullptr, dw.p, rows, n, 1e-6f, DType::kF32, dout.p,
                     nullptr);
    CHECK(dx.get(x.size()) == want_x);
    const auto got = dout.get(x.size());
    CHECK(rel_err(got, want) < 1e-5);
    Dev<float> dx2(x);
    Dev<uint16_t> halves(std::vector<uint16_t>(x.size()));
    cu::add_rms_norm(dx2.p, add ? dy.p : nullptr, with_bias ? db.p : nullptr, dw.p, rows, n, 1e-6f, DType::kBF16,
                     halves.p, nullptr);
    const auto h = halves.get(x.size());
    bool same = true;
    for (std::size_t i = 0; i < h.size(); ++i) same = same && h[i] == f32_to_bf16(got[i]);
    CHECK(same);
  }
}

TEST_CASE("qkv_rope: bias, q/k norm and RoPE against the CPU formulas (< 1e-5); K and V in their pool slots", "[gpu]") {
  // head_dim 64: one warp; 128: two warps sum each norm; 96: the second warp half idle.
  for (const int64_t hd : {int64_t{64}, int64_t{128}, int64_t{96}}) {
  INFO("head_dim " << hd);
  const int64_t heads = 4, kvh = 2, layers = 2, layer = 1, bs = 16;
  const std::vector<int32_t> positions = {0, 1, 5, 17, 100, 4095, 30000};
  const auto rows = static_cast<int64_t>(positions.size());
  const kv::KvLayout L{layers, kvh, hd, bs};
  // Row r is its own sequence, its last block is block r; its earlier blocks are all block `rows`,
  // which must stay untouched (zero).
  std::vector<int32_t> tables, table_of;
  for (int64_t r = 0; r < rows; ++r) {
    table_of.push_back(static_cast<int32_t>(tables.size()));
    tables.insert(tables.end(), static_cast<std::size_t>(positions[r] / bs), static_cast<int32_t>(rows));
    tables.push_back(static_cast<int32_t>(r));
  }
  const int64_t width = (heads + 2 * kvh) * hd;
  const auto qkv = random_floats(rows * width, 14), bias = random_floats(width, 15);
  const auto q_norm = random_floats(hd, 16), k_norm = random_floats(hd, 17);
  std::vector<float> inv_freq(hd / 2);
  for (int64_t i = 0; i < hd / 2; ++i) inv_freq[i] = static_cast<float>(1.0 / std::pow(1e6, 2.0 * i / hd));
  for (const bool qwen : {true, false}) {  // bias and q/k norm (Qwen-style), or neither (Llama)
    INFO((qwen ? "bias and q/k norm" : "plain"));
    std::vector<float> pool(static_cast<std::size_t>((rows + 1) * L.block_floats()), 0.0f), q(rows * heads * hd);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t s = 0; s < heads + 2 * kvh; ++s) {
        std::vector<float> v(qkv.begin() + r * width + s * hd, qkv.begin() + r * width + (s + 1) * hd);
        if (qwen)
          for (int64_t i = 0; i < hd; ++i) v[i] += bias[s * hd + i];
        if (s < heads + kvh) {
          if (qwen) reference_norm(v.data(), (s < heads ? q_norm : k_norm).data(), hd, 1e-6f);
          reference_rope(v.data(), hd, positions[r], inv_freq);
        }
        float* dst = s < heads ? q.data() + (r * heads + s) * hd
                     : s < heads + kvh ? pool.data() + L.offset(r, layer, 0, s - heads, positions[r] % bs)
                                       : pool.data() + L.offset(r, layer, 1, s - heads - kvh, positions[r] % bs);
        std::copy(v.begin(), v.end(), dst);
      }
    Dev<float> dqkv(qkv), dbias(bias), dqn(q_norm), dkn(k_norm), dinv(inv_freq), dq(std::vector<float>(q.size())),
        dpool(std::vector<float>(pool.size(), 0.0f));
    Dev<int32_t> dtables(tables), dtable_of(table_of), dpos(positions);
    const cu::RowTables rt{dpos.p, dtable_of.p, dtables.p};
    cu::qkv_rope(dqkv.p, rows, heads, qwen ? dbias.p : nullptr, qwen ? dqn.p : nullptr, qwen ? dkn.p : nullptr, 1e-6f,
                 dinv.p, rt, {layers, kvh, hd, bs}, layer, dpool.p, dq.p, nullptr);
    CHECK(rel_err(dq.get(q.size()), q) < 1e-5);
    const auto got_pool = dpool.get(pool.size());
    CHECK(rel_err(got_pool, pool) < 1e-5);
    // V is only moved (and biased): exact. Nothing outside the rows' slots is written.
    bool v_exact = true, elsewhere_zero = true;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < kvh * hd; ++i) {
        const auto at = static_cast<std::size_t>(L.offset(r, layer, 1, i / hd, positions[r] % bs) + i % hd);
        v_exact = v_exact && got_pool[at] == pool[at];
      }
    for (std::size_t i = 0; i < pool.size(); ++i) elsewhere_zero = elsewhere_zero && (pool[i] != 0.0f || got_pool[i] == 0.0f);
    CHECK(v_exact);
    CHECK(elsewhere_zero);
    // A bf16 pool: the same values rounded to bf16 (V, only moved, to the same bits as the host's rounding).
    Dev<uint16_t> dpool16(std::vector<uint16_t>(pool.size(), 0));
    cu::qkv_rope(dqkv.p, rows, heads, qwen ? dbias.p : nullptr, qwen ? dqn.p : nullptr, qwen ? dkn.p : nullptr, 1e-6f,
                 dinv.p, rt, {layers, kvh, hd, bs, DType::kBF16}, layer, dpool16.p, dq.p, nullptr);
    const auto got16 = dpool16.get(pool.size());
    CHECK(rel_err(from_bf16(got16), pool) < 1e-2);
    bool elsewhere16_zero = true;
    for (std::size_t i = 0; i < pool.size(); ++i) elsewhere16_zero = elsewhere16_zero && (pool[i] != 0.0f || got16[i] == 0);
    CHECK(elsewhere16_zero);
    bool v16_exact = true;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < kvh * hd; ++i) {
        const auto at = static_cast<std::size_t>(L.offset(r, layer, 1, i / hd, positions[r] % bs) + i % hd);
        v16_exact = v16_exact && got16[at] == f32_to_bf16(pool[at]);
      }
    CHECK(v16_exact);
    // An FP8 pool: each K and V row the bytes the CPU's quantize_fp8_row makes of the float32 path's row (the
    // same arithmetic up to the store), its scale after its codes; nothing else written.
    kv::KvLayout L8 = L;
    L8.elem_bytes = 1;
    Dev<uint8_t> dpool8(std::vector<uint8_t>(static_cast<std::size_t>((rows + 1) * L8.block_bytes()), 0));
    cu::qkv_rope(dqkv.p, rows, heads, qwen ? dbias.p : nullptr, qwen ? dqn.p : nullptr, qwen ? dkn.p : nullptr, 1e-6f,
                 dinv.p, rt, {layers, kvh, hd, bs, DType::kF8E4M3}, layer, dpool8.p, dq.p, nullptr);
    const auto got8 = dpool8.get(static_cast<std::size_t>((rows + 1) * L8.block_bytes()));
    auto fp8_of = [&](const std::vector<float>& f32_pool) {  // the CPU's rows of a float32 pool's K and V
      std::vector<uint8_t> out(got8.size(), 0);
      for (int64_t r = 0; r < rows; ++r)
        for (int kv = 0; kv < 2; ++kv)
          for (int64_t g = 0; g < kvh; ++g)
            runtime::cpu::quantize_fp8_row(f32_pool.data() + L.offset(r, layer, kv, g, positions[r] % bs), hd,
                                           out.data() + L8.offset(r, layer, kv, g, positions[r] % bs));
      return out;
    };
    CHECK(got8 == fp8_of(got_pool));
    // Rows the scale treats apart: row 0 all zeros (scale 0, codes 0), row 1 with an infinity (scale NaN).
    std::vector<float> odd = qkv;
    std::fill(odd.begin(), odd.begin() + width, 0.0f);
    odd[static_cast<std::size_t>(width + heads * hd + 3)] = INFINITY;  // row 1, its first K head
    odd[static_cast<std::size_t>(width + (heads + kvh) * hd + 5)] = -INFINITY;  // and its first V head
    Dev<float> dodd(odd), dpool_f(std::vector<float>(pool.size(), 0.0f));
    Dev<uint8_t> dpool8b(std::vector<uint8_t>(got8.size(), 0));
    for (const bool fp8 : {false, true})
      cu::qkv_rope(dodd.p, rows, heads, nullptr, nullptr, nullptr, 1e-6f, dinv.p, rt,
                   {layers, kvh, hd, bs, fp8 ? DType::kF8E4M3 : DType::kF32}, layer,
                   fp8 ? static_cast<void*>(dpool8b.p) : static_cast<void*>(dpool_f.p), dq.p, nullptr);
    const auto rows_f = dpool_f.get(pool.size());
    const auto got8b = dpool8b.get(got8.size());
    CHECK(got8b == fp8_of(rows_f));  // NaN scales compare by their bytes
    float zero_scale = -1;
    std::memcpy(&zero_scale, got8b.data() + L8.offset(0, layer, 0, 0, positions[0] % bs) + hd, 4);
    CHECK(zero_scale == 0.0f);
  }
  }
}

TEST_CASE("swiglu over the fused gate/up product (< 1e-5), its bf16 output the same value rounded", "[gpu]") {
  const int64_t rows = 5, n = 300;
  const auto gu = random_floats(rows * 2 * n, 5);
  std::vector<float> want(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < n; ++i) {
      const float g = gu[r * 2 * n + i], u = gu[r * 2 * n + n + i];
      want[r * n + i] = g * (1.0f / (1.0f + std::exp(-g))) * u;
    }
  Dev<float> dgu(gu), dout(std::vector<float>(want.size()));
  cu::swiglu(dgu.p, rows, n, DType::kF32, dout.p, nullptr);
  const auto got = dout.get(want.size());
  CHECK(rel_err(got, want) < 1e-5);
  Dev<uint16_t> halves(std::vector<uint16_t>(want.size()));
  cu::swiglu(dgu.p, rows, n, DType::kBF16, halves.p, nullptr);
  const auto h = halves.get(want.size());
  bool same = true;
  for (std::size_t i = 0; i < h.size(); ++i) same = same && h[i] == f32_to_bf16(got[i]);
  CHECK(same);
}

TEST_CASE("attention over a paged pool matches a plain softmax (< 1e-5): by row, split over positions, and in tiles",
          "[gpu]") {
  const int64_t layers = 2, kvh = 2, hd = 64, bs = 16, heads = 4, blocks = 8, layer = 1;
  const kv::KvLayout L{layers, kvh, hd, bs};
  // Two sequences: A has 40 positions in blocks {5, 1, 6}, B 3 positions in block {2}; this step
  // writes A's positions 37..39 and B's 0..2 (A's earlier positions are filled directly).
  std::vector<float> pool = random_floats(static_cast<std::size_t>(blocks * L.block_floats()), 6);
  const std::vector<int32_t> tables = {5, 1, 6, 2}, table_of = {0, 0, 0, 3, 3, 3}, positions = {37, 38, 39, 0, 1, 2};
  const int64_t rows = 6, width = kvh * hd;
  const auto k = random_floats(rows * width, 7), v = random_floats(rows * width, 8), q = random_floats(rows * heads * hd, 9);
  for (int64_t r = 0; r < rows; ++r) {  // the step's own K and V, as qkv_rope places them
    const int64_t blk = tables[table_of[r] + positions[r] / bs], slot = positions[r] % bs;
    for (int64_t i = 0; i < width; ++i) {
      pool[L.offset(blk, layer, 0, i / hd, slot) + i % hd] = k[r * width + i];
      pool[L.offset(blk, layer, 1, i / hd, slot) + i % hd] = v[r * width + i];
    }
  }
  Dev<float> dpool(pool), dq(q);
  Dev<int32_t> dtables(tables), dtable_of(table_of), dpos(positions);
  const cu::RowTables rt{dpos.p, dtable_of.p, dtables.p};
  const cu::PoolShape shape{layers, kvh, hd, bs};
  const auto want = reference_attention(q, pool, L, layer, heads, tables, table_of, positions, 0);
  // One block per (row, head), then split over positions (more splits than B's 3 positions leaves some empty);
  // each twice, since the last block of each (row, head) must leave its counter at zero.
  auto check_splits = [&](const cu::PoolShape& sh, const void* pool_dev, const std::vector<float>& expect,
                          std::initializer_list<int64_t> split_counts) {
    for (const int64_t splits : split_counts) {
      INFO("splits " << splits << (sh.kv == DType::kBF16 ? ", bf16 pool" : ""));
      Dev<float> partial(std::vector<float>(static_cast<std::size_t>(rows * heads * splits * (hd + 2))));
      Dev<int32_t> counters(std::vector<int32_t>(static_cast<std::size_t>(rows * heads), 0));
      for (int round = 0; round < 2; ++round) {
        Dev<float> fresh(std::vector<float>(rows * heads * hd, -7.0f));
        cu::attention(dq.p, rows, heads, 0, rt, sh, layer, pool_dev, fresh.p, nullptr, nullptr,
                      {partial.p, counters.p, splits});
        CHECK(rel_err(fresh.get(expect.size()), expect) < 1e-5);
        CHECK(counters.get(static_cast<std::size_t>(rows * heads)) == std::vector<int32_t>(rows * heads, 0));
      }
    }
  };
  check_splits(shape, dpool.p, want, {1, 3, 7, cu::kMaxAttentionSplits});
  CHECK(cu::attention_splits(1, 16, 132) == cu::kMaxAttentionSplits);
  CHECK(cu::attention_splits(8, 16, 132) == 5);
  CHECK(cu::attention_splits(64, 16, 132) == 1);
  // The tiled prefill kernel gives the same: A's three rows as one tile, B's as another.
  Dev<int32_t> dtiles(std::vector<int32_t>{0, 3, 3, 3});
  Dev<float> dtiled(std::vector<float>(rows * heads * hd, -7.0f));
  cu::attention_tiles(dq.p, heads, 0, rt, dtiles.p, 2, shape, layer, dpool.p, dtiled.p, nullptr);
  CHECK(rel_err(dtiled.get(want.size()), want) < 1e-5);
  // On the tensor cores: within bf16 rounding of q, K and V (and of the probabilities).
  Dev<float> dtc(std::vector<float>(rows * heads * hd, -7.0f));
  cu::attention_tiles_tc(dq.p, heads, 0, rt, dtiles.p, 2, shape, layer, dpool.p, dtc.p, nullptr);
  CHECK(rel_err(dtc.get(want.size()), want) < 2e-2);
  // A bf16 pool: every kernel against the reference over the rounded values.
  const auto pool16 = to_bf16(pool);
  const auto want16 = reference_attention(q, from_bf16(pool16), L, layer, heads, tables, table_of, positions, 0);
  Dev<uint16_t> dpool16(pool16);
  cu::PoolShape shape16 = shape;
  shape16.kv = DType::kBF16;
  check_splits(shape16, dpool16.p, want16, {1, 7});
  Dev<float> tiled16(std::vector<float>(rows * heads * hd, -7.0f)), tc16(std::vector<float>(rows * heads * hd, -7.0f));
  cu::attention_tiles(dq.p, heads, 0, rt, dtiles.p, 2, shape16, layer, dpool16.p, tiled16.p, nullptr);
  CHECK(rel_err(tiled16.get(want16.size()), want16) < 1e-5);
  cu::attention_tiles_tc(dq.p, heads, 0, rt, dtiles.p, 2, shape16, layer, dpool16.p, tc16.p, nullptr);
  CHECK(rel_err(tc16.get(want16.size()), want16) < 2e-2);
}

TEST_CASE("tiled prefill attention (float32 and tensor cores): full 16-row tiles, a sliding window starting inside a "
          "key tile, head_dim 128, 96 and 256",
          "[gpu]") {
  // 96: the warps take uneven column slices of O; 256: past 48 KiB of shared memory (opt-in).
  // Query heads per KV head 4, 8 and 3: the tensor-core kernel's blocks take 4, 8 (or 4 twice) and 3 of them.
  for (const int64_t hd : {int64_t{128}, int64_t{96}, int64_t{256}})
  for (const int64_t heads : {int64_t{8}, int64_t{16}, int64_t{6}}) {
  INFO("head_dim " << hd << ", heads " << heads);
  const int64_t layers = 1, kvh = 2, bs = 16, blocks = 6, layer = 0;
  const kv::KvLayout L{layers, kvh, hd, bs};
  const std::vector<float> pool = random_floats(static_cast<std::size_t>(blocks * L.block_floats()), 10);
  // One sequence of 80 positions in blocks {4, 0, 5, 2, 1}; this step's rows are positions 45..79 (35 rows).
  const std::vector<int32_t> tables = {4, 0, 5, 2, 1};
  std::vector<int32_t> table_of, positions, tiles_first, tiles_rows;
  for (int32_t p = 45; p < 80; ++p) table_of.push_back(0), positions.push_back(p);
  for (int32_t r = 0; r < 35; r += 16) tiles_first.push_back(r), tiles_rows.push_back(std::min(16, 35 - r));
  std::vector<int32_t> tiles = tiles_first;
  tiles.insert(tiles.end(), tiles_rows.begin(), tiles_rows.end());
  const auto q = random_floats(positions.size() * heads * hd, 11);
  Dev<float> dpool(pool), dq(q), dout(std::vector<float>(q.size()));
  Dev<int32_t> dtables(tables), dtable_of(table_of), dpos(positions), dtiles(tiles);
  const cu::RowTables rt{dpos.p, dtable_of.p, dtables.p};
  const cu::PoolShape shape{layers, kvh, hd, bs};
  for (int64_t window : {int64_t{0}, int64_t{21}}) {
    INFO("sliding window " << window);
    const auto want = reference_attention(q, pool, L, layer, heads, tables, table_of, positions, window);
    // Each kernel writes over a sentinel, so one that wrote nothing cannot pass on another's output.
    const std::vector<float> sentinel(q.size(), -7.0f);
    auto reset = [&] { REQUIRE(cudaMemcpy(dout.p, sentinel.data(), q.size() * 4, cudaMemcpyHostToDevice) == cudaSuccess); };
    reset();
    cu::attention_tiles(dq.p, heads, window, rt, dtiles.p, static_cast<int64_t>(tiles_first.size()), shape, layer, dpool.p,
                        dout.p, nullptr);
    CHECK(rel_err(dout.get(q.size()), want) < 1e-5);
    // Tensor cores: 80 keys are two key tiles of 64, so the online rescaling between them is exercised.
    reset();
    cu::attention_tiles_tc(dq.p, heads, window, rt, dtiles.p, static_cast<int64_t>(tiles_first.size()), shape, layer,
                           dpool.p, dout.p, nullptr);
    CHECK(rel_err(dout.get(q.size()), want) < 2e-2);
    // The same from a bf16 pool (against the reference over the rounded values).
    const auto pool16 = to_bf16(pool);
    const auto want16 = reference_attention(q, from_bf16(pool16), L, layer, heads, tables, table_of, positions, window);
    Dev<uint16_t> dpool16(pool16);
    cu::PoolShape shape16 = shape;
    shape16.kv = DType::kBF16;
    const auto n_tiles = static_cast<int64_t>(tiles_first.size());
    reset();
    cu::attention_tiles(dq.p, heads, window, rt, dtiles.p, n_tiles, shape16, layer, dpool16.p, dout.p, nullptr);
    CHECK(rel_err(dout.get(q.size()), want16) < 1e-5);
    reset();
    cu::attention_tiles_tc(dq.p, heads, window, rt, dtiles.p, n_tiles, shape16, layer, dpool16.p, dout.p, nullptr);
    CHECK(rel_err(dout.get(q.size()), want16) < 2e-2);
  }
}
}

// The whole model, float32 and bf16: logits of a 50-token prompt in chunks and three decode steps.
// Against the CPU engine with the same KV element type: float32 KV, and bf16 KV (both round K and V to
// nearest even, so a float32 model with bf16 KV must agree almost as closely as with float32 KV).
TEST_CASE("full-model logits match the CPU engine with the same KV dtype (f32 < 1e-4, f32 with bf16 KV < 5e-3, bf16 "
          "and FP8 KV < 3e-2 relative)",
          "[gpu]") {
  // Qwen3 (q/k norm), Qwen2 (q/k/v bias), Llama (neither).
  const std::pair<const char*, const char*> models[] = {{"qwen3", "f32"}, {"qwen3", "bf16"}, {"qwen2", "f32"}, {"llama", "bf16"}};
  for (const auto& [arch, dtype] : models) {
    INFO(arch << " " << dtype);
    testing::TinyModel tiny(arch, dtype);
    auto rowmajor = ModelWeights::load(tiny.config, tiny.dir, false);
    std::mt19937 rng(3);
    std::vector<int32_t> prompt(53);  // 50 prefilled, 3 decoded
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
    // The prompt in chunks of 20 (prefill), then 3 single-token steps (decode:
    // with graphs, the first runs eagerly, the second is captured, the third replays it).
    auto run = [&](ModelBackend& m, kv::BlockPool& pool) { return testing::chunked_logits(m, pool, prompt); };
    cpu::ThreadPool threads(2);
    auto cpu_logits = [&](int64_t kv_bytes) {
      kv::BlockPool cpu_pool({tiny.config.layers, tiny.config.kv_heads, tiny.config.head_dim, 16, kv_bytes}, 8);
      cpu::CpuModel cpu_model(tiny.config, *tiny.weights, cpu_pool, threads);
      return run(cpu_model, cpu_pool);
    };
    const std::map<int64_t, std::vector<float>> want = {{4, cpu_logits(4)}, {2, cpu_logits(2)}, {1, cpu_logits(1)}};
    const bool f32 = std::string(dtype) == "f32";
    for (const bool graphs : {true, false})
      for (const int64_t kv_bytes : {int64_t{4}, int64_t{2}, int64_t{1}}) {  // KV in float32, bf16 and FP8 (kv.dtype)
        INFO((graphs ? "decode steps as CUDA graphs" : "no graphs") << ", KV of " << kv_bytes << "-byte elements");
        DevPool dev(tiny.config, 8, kv_bytes);
        cu::CudaModel gpu(tiny.config, *rowmajor, *dev.pool);
        gpu.use_graphs(graphs);
        const auto got = run(gpu, *dev.pool);
        const std::vector<float>& w = want.at(kv_bytes);
        REQUIRE(got.size() == w.size());
        const double err = rel_err(got, w);
        if (kv_bytes == 1) std::printf("cuda %s %s, FP8 KV: largest logit difference from the CPU engine's %.3g\n", arch, dtype, err);
        // FP8 KV: the same codes unless a K or V value sits at a code boundary, where the products' rounding moves it.
        CHECK(err < (!f32 ? 3e-2 : kv_bytes == 4 ? 1e-4 : kv_bytes == 2 ? 5e-3 : 1e-2));
      }
  }
}

TEST_CASE("greedy tokens equal the CPU engine's for 32 steps in float32", "[gpu]") {
  testing::TinyModel tiny("qwen3", "f32");
  testing::check_greedy_like_cpu(tiny, *ModelWeights::load(tiny.config, tiny.dir, false), 4);
}
