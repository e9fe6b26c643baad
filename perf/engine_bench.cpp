// The CPU engine against the machine's own limits, measured in the same run.
//
//   engine_bench [--model DIR] [--threads N] [--quick]
//                [--only prefill|prefill:LEN|decode:N|decode-sampled:N|decode-long:f32|bf16|fp8]
//
// Without --model it makes the `bench` model (Qwen3-0.6B's shape, bf16) under
// build/bench-model once. Prints: STREAM triad and FMA peak; prefill tokens/s
// for 512-token prompts; decode tokens/s at 1, 8, 32 and 64 concurrent
// sequences, and at 32 sampled (temperature, top_p) against greedy; each as a
// percentage of its roofline (decode: bandwidth / bytes of weights read per
// step; prefill: FMA peak / flops per token), and decode of 1 sequence as
// its fastest step against the run's best triad (the same statistic: the best
// of short intervals). Then long-context decode (8
// sequences 1,024 tokens deep, where KV reads rival the weights') with
// float32, bf16 and FP8 KV, against the roofline of weights + KV bytes.
// Figures only: it never fails on time.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common/error.h"
#include "planner/machine.h"
#include "runtime/cpu/kernels.h"
#include "runtime/engine/engine.h"
#include "perf/bench_model.h"
#include "runtime/model/quantize.h"
#include "runtime/model/weights.h"

using namespace tandem;
using Clock = std::chrono::steady_clock;
using perf::matrix_bytes;
using perf::step_weight_bytes;

namespace {

struct Run {
  double seconds = 0;
  int64_t tokens = 0;
  double fastest = 1e30;  // decode: the fastest timed step's seconds
};

// Decode throughput: n sequences with prompts of prompt_len tokens; times
// only steps that have no prefill in them.
// sampled: temperature 0.7, top_p 0.9 instead of greedy (the host sampler's cost on top of the step).
// kv_bytes: the KV pool's element size (4: f32, 2: bf16, 1: FP8 rows with their scales; 0: as kv.dtype = "auto"
// gives it to the kernels in use, bf16 under bf16-amx, else f32).
int64_t kv_auto(int64_t kv_bytes) { return kv_bytes ? kv_bytes : runtime::cpu::kernels().attend ? 2 : 4; }

Run decode(const runtime::ModelConfig& c, const runtime::ModelWeights& w, runtime::cpu::ThreadPool& threads, int64_t n,
           int64_t steps, bool sampled = false, int64_t prompt_len = 32, int64_t kv_bytes = 0) {
  kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16, kv_auto(kv_bytes)},
                     n * ((prompt_len + steps + 16) / 16 + 1));
  runtime::Engine e(c, w, pool, threads, nullptr, {n, 4096, 0});
  std::mt19937 rng(1);
  for (int64_t i = 0; i < n; ++i) {
    runtime::EngineRequest r{static_cast<uint64_t>(i), {}, {}, static_cast<uint64_t>(i)};
    for (int64_t k = 0; k < prompt_len; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % 150000));
    r.params.max_tokens = steps + 1;
    r.params.temperature = sampled ? 0.7f : 0.0f;
    r.params.top_p = sampled ? 0.9f : 1.0f;
    r.params.ignore_eos = true;
    e.add(r);
  }
  Run run;
  while (e.has_work()) {
    const auto before = e.stats();
    const auto t0 = Clock::now();
    e.step();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (e.stats().prefill_tokens == before.prefill_tokens) {
      run.seconds += dt;
      run.tokens += e.stats().decode_tokens - before.decode_tokens;
      run.fastest = std::min(run.fastest, dt);
    }
  }
  return run;
}

Run prefill(const runtime::ModelConfig& c, const runtime::ModelWeights& w, runtime::cpu::ThreadPool& threads,
            int64_t prompts, int64_t len) {
  kv::BlockPool pool({c.layers, c.kv_heads, c.head_dim, 16, kv_auto(0)}, prompts * (len / 16 + 2));
  runtime::Engine e(c, w, pool, threads, nullptr, {prompts, len, 0});
  std::mt19937 rng(2);
  for (int64_t i = 0; i < prompts; ++i) {
    runtime::EngineRequest r{static_cast<uint64_t>(i), {}, {}, 0};
    for (int64_t k = 0; k < len; ++k) r.prompt.push_back(static_cast<int32_t>(rng() % 150000));
    r.params.max_tokens = 1;
    r.params.temperature = 0;
    e.add(r);
  }
  Run run;
  const auto t0 = Clock::now();
  while (e.has_work()) e.step();
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  run.tokens = e.stats().prefill_tokens;
  return run;
}

struct Options {
  std::string model_dir;
  int threads = 0;
  bool quick = false;
  std::string only;  // one measurement, for a profiler
  bool quantized = false;  // also the FP8 and INT8 twins of the bench model against it
};

bool parse_options(int argc, char** argv, Options& o) {
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--model") && i + 1 < argc) o.model_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) o.threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--quick")) o.quick = true;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc) o.only = argv[++i];
    else if (!std::strcmp(argv[i], "--quantized")) o.quantized = true;
    else return false;
  }
  return true;
}

// The bench model (Qwen3-0.6B's shape, bf16), made once under the build folder.

double tokens_per_s(const Run& r) { return static_cast<double>(r.tokens) / r.seconds; }

struct Decode {
  int64_t n;
  Run run;
  double triad;  // GB/s around this measurement
};

// Everything measured in one run, machine limits included.
struct Figures {
  int threads = 0;
  double read_bw = 0, peak2 = 0, peak512 = 0, peak = 0, peak_bf16 = 0;
  bool has512 = false;
  Run prefill;
  std::vector<Decode> decodes;  // 1 (median round), 8, 32, 64 sequences
  double triad_lo = 1e30, triad_hi = 0;
  Run sampled32, long32, long16, long8;
  double long_triad = 0;
  int measurements = 0;
  double fastest1 = 1e30;  // decode of 1: the fastest step of all its rounds, in seconds
};

constexpr int64_t kPrefillLen = 512;
constexpr int64_t kLongN = 8, kLongCtx = 1024;  // long-context decode: this many sequences this deep

Run decode_long(const runtime::ModelConfig& c, const runtime::ModelWeights& w, runtime::cpu::ThreadPool& threads,
                bool quick, int64_t kv_bytes) {
  return decode(c, w, threads, kLongN, quick ? 8 : 16, false, kLongCtx, kv_bytes);
}

// This machine's memory bandwidth moves by up to 30% from minute to minute
// (other tenants), so each decode measurement gets its own triad, the better
// of one just before and one just after it. Batch 1, the bandwidth-bound
// case, is measured in several such rounds and the median round reported.
Figures measure_all(const runtime::ModelConfig& c, const runtime::ModelWeights& w, runtime::cpu::ThreadPool& threads,
                    bool quick) {
  Figures f;
  const int T = f.threads = threads.size();
  f.read_bw = planner::read_gbps(T);
  f.peak2 = planner::fma_peak_gflops(T, false);
  f.has512 = planner::cpu_has_avx512();
  f.peak512 = f.has512 ? planner::fma_peak_gflops(T, true) : 0;
  f.peak = f.has512 ? f.peak512 : f.peak2;
  f.peak_bf16 = planner::bf16_dot_peak_gflops(T);
  f.prefill = prefill(c, w, threads, quick ? 1 : 2, kPrefillLen);
  auto measure = [&](int64_t n) {
    const double before = planner::triad_gbps(T);
    Run d = decode(c, w, threads, n, quick ? 8 : 24);
    const double after = planner::triad_gbps(T);
    f.triad_lo = std::min({f.triad_lo, before, after});
    f.triad_hi = std::max({f.triad_hi, before, after});
    f.measurements += 2;
    return Decode{n, d, std::max(before, after)};
  };
  std::vector<Decode> rounds;
  for (int i = 0; i < (quick ? 3 : 5); ++i) rounds.push_back(measure(1));
  std::sort(rounds.begin(), rounds.end(), [&](const Decode& a, const Decode& b) {
    return tokens_per_s(a.run) / a.triad < tokens_per_s(b.run) / b.triad;
  });
  f.decodes.push_back(rounds[rounds.size() / 2]);
  for (const Decode& r : rounds) f.fastest1 = std::min(f.fastest1, r.run.fastest);
  for (int64_t n : {8, 32, 64}) f.decodes.push_back(measure(n));
  f.sampled32 = decode(c, w, threads, 32, quick ? 8 : 24, true);  // against decodes[2], greedy at 32
  const double long_triad0 = planner::triad_gbps(T);
  f.long32 = decode_long(c, w, threads, quick, 4);
  f.long16 = decode_long(c, w, threads, quick, 2);
  f.long8 = decode_long(c, w, threads, quick, 1);
  f.long_triad = std::max(long_triad0, planner::triad_gbps(T));
  return f;
}

void print_figures(const Figures& f, const runtime::ModelConfig& c, const runtime::ModelWeights& w) {
  // Bytes one decode step must read (every matrix once), and flops per prefill token.
  double weight_bytes = matrix_bytes(w.lm_head);
  double matmul_params = 0;
  for (const auto& l : w.layers) {
    for (const auto* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      weight_bytes += matrix_bytes(*m);
      matmul_params += static_cast<double>(m->rows * m->cols);
    }
  }
  std::printf("machine: %d threads, kernels %s\n", f.threads, runtime::cpu::kernels().name);
  std::printf("  STREAM triad          %.1f-%.1f GB/s (%d measurements in this run)\n", f.triad_lo, f.triad_hi,
              f.measurements);
  std::printf("  read-only stream      %8.1f GB/s\n", f.read_bw);
  std::printf("  FMA peak (AVX2)       %8.1f GFLOP/s\n", f.peak2);
  if (f.has512) std::printf("  FMA peak (AVX-512)    %8.1f GFLOP/s\n", f.peak512);
  if (f.peak_bf16 > 0) std::printf("  BF16 dot peak         %8.1f GFLOP/s (AVX512-BF16)\n", f.peak_bf16);
  std::printf("model: %s, %ld layers, hidden %ld, %s, %.2f GB of matrices read per decode step\n",
              c.architecture.c_str(), static_cast<long>(c.layers), static_cast<long>(c.hidden),
              std::string(runtime::dtype_name(c.dtype)).c_str(), weight_bytes / 1e9);

  const double avg_ctx = kPrefillLen / 2.0;
  const double flops_per_token =
      2.0 * matmul_params + 4.0 * static_cast<double>(c.layers * c.heads * c.head_dim) * avg_ctx;
  const double ptps = tokens_per_s(f.prefill);
  const double gflops = ptps * flops_per_token / 1e9;
  std::printf("prefill, %ld-token prompts: %8.1f tokens/s = %6.1f GFLOP/s = %5.1f%% of FMA peak (%s)\n",
              static_cast<long>(kPrefillLen), ptps, gflops, 100.0 * gflops / f.peak, f.has512 ? "AVX-512" : "AVX2");
  if (std::string(runtime::cpu::kernels().name) == "avx512-bf16" && f.peak_bf16 > 0) {
    // The bf16 table: the products at the BF16 dot peak, attention (FP32) at the FMA peak.
    const double attn = flops_per_token - 2.0 * matmul_params;
    const double ideal_s = 2.0 * matmul_params / (f.peak_bf16 * 1e9) + attn / (f.peak * 1e9);
    std::printf("  = %5.1f%% of the roofline of bf16 dot products (products at %.0f GFLOP/s, attention at %.0f)\n",
                100.0 * ideal_s * ptps, f.peak_bf16, f.peak);
  }

  // A decode step reads every matrix once (the bandwidth roofline: triad / bytes) and does
  // 2 flops per weight per sequence, the LM head included (the compute roofline).
  const double lm_params = static_cast<double>(w.lm_head.rows * w.lm_head.cols);
  for (const Decode& d : f.decodes) {
    const double tps = tokens_per_s(d.run);
    const double step_s = 1.0 / (tps / static_cast<double>(d.n));
    const double gbps = weight_bytes / step_s / 1e9;
    const double gf = tps * 2.0 * (matmul_params + lm_params) / 1e9;
    std::printf("decode, %3ld sequences: %8.1f tokens/s, %6.1f ms/step, weights read at %5.1f GB/s = %5.1f%% of "
                "the bandwidth roofline (triad %.1f GB/s)%s, %6.1f GFLOP/s = %5.1f%% of FMA peak\n",
                static_cast<long>(d.n), tps, 1e3 * step_s, gbps, 100.0 * gbps / d.triad, d.triad,
                d.n == 1 ? " [median of rounds]" : "", gf, 100.0 * gf / f.peak);
  }
  // The same statistic on both sides: the triad is the best of short repetitions (~10 ms), so the kernel's
  // figure beside it is its best step (~30 ms), each the rate when the machine's neighbours leave the most.
  const double fastest_gbps = weight_bytes / f.fastest1 / 1e9;
  std::printf("decode,   1 sequence, its fastest step: %6.1f ms, weights read at %5.1f GB/s = %5.1f%% of the best "
              "triad of this run (%.1f GB/s): both the best of short intervals\n",
              1e3 * f.fastest1, fastest_gbps, 100.0 * fastest_gbps / f.triad_hi, f.triad_hi);
  std::printf("decode,  32 sequences sampled (temperature 0.7, top_p 0.9): %8.1f tokens/s = %5.1f%% of greedy's\n",
              tokens_per_s(f.sampled32), 100.0 * tokens_per_s(f.sampled32) / tokens_per_s(f.decodes[2].run));
  // A long-context step reads the weights once and every sequence's K and V
  // (the average depth over the timed steps: about kLongCtx).
  for (auto [name, run, kv_bytes] :
       {std::tuple{"f32 ", f.long32, 4}, std::tuple{"bf16", f.long16, 2}, std::tuple{"fp8 ", f.long8, 1}}) {
    const double tps = tokens_per_s(run);
    const double step_s = static_cast<double>(kLongN) / tps;
    const double per_value = kv::KvLayout{c.layers, c.kv_heads, c.head_dim, 16, kv_bytes}.bytes_per_value();
    const double kv = static_cast<double>(kLongN * kLongCtx * c.layers * 2 * c.kv_heads * c.head_dim) * per_value;
    const double gbps = (weight_bytes + kv) / step_s / 1e9;
    std::printf("decode, %ld sequences %ld tokens deep, %s KV: %8.1f tokens/s, %6.1f ms/step, %.2f GB of KV + "
                "%.2f GB of weights per step at %5.1f GB/s = %5.1f%% of the bandwidth roofline (triad %.1f GB/s)\n",
                static_cast<long>(kLongN), static_cast<long>(kLongCtx), name, tps, 1e3 * step_s, kv / 1e9,
                weight_bytes / 1e9, gbps, 100.0 * gbps / f.long_triad, f.long_triad);
  }
  std::printf("decode, %ld sequences %ld tokens deep: bf16 KV %.2fx the tokens/s of f32 KV, half the KV memory; fp8 KV "
              "%.2fx, %.1f%% of it\n",
              static_cast<long>(kLongN), static_cast<long>(kLongCtx), tokens_per_s(f.long16) / tokens_per_s(f.long32),
              tokens_per_s(f.long8) / tokens_per_s(f.long32),
              100.0 * kv::KvLayout{c.layers, c.kv_heads, c.head_dim, 16, 1}.bytes_per_value() / 4.0);
}

// --quantized: the bench model against its FP8-block and INT8-channel twins
// (written once by tandem quantize's code beside it), and the INT8 twin with
// its activations quantized too (model.cpu_matmul = "int8") where the CPU has
// AVX512-VNNI, and bf16 and FP8 under model.cpu_matmul = "bf16-amx" where it has
// AVX512-BF16 (on AMX's tiles where it has AMX-BF16), measured round-robin so the
// machine's drift falls on all alike.
struct Variant {
  std::string name;
  runtime::cpu::MatmulMode mode = runtime::cpu::MatmulMode::kF32;  // the products' arithmetic
  runtime::ModelConfig c;
  std::shared_ptr<runtime::ModelWeights> w;  // shared by the variants of one checkpoint
  std::vector<Decode> ones;  // decode of 1, several rounds
  Run decode32, prefill;
  double step_bytes = 0, held_bytes = 0;
};

double held_bytes(const runtime::ModelWeights& w) {  // the matrices as held in memory, the scales too
  double b = step_weight_bytes(w);
  if (w.lm_head.data != w.embed.data) b += matrix_bytes(w.embed);
  for (const auto& g : w.scale_grids) b += static_cast<double>(g.size() * sizeof(float));
  return b;
}

// GB/s of codes one core turns into products with one row of x: the best of
// five rounds over 512 rows of W (512 KiB of codes at hidden 1024: in L2), so
// the rate is the kernel's, not the memory's.
double codes_rate(const runtime::cpu::KernelTable& t, const runtime::Matrix& W) {
  const runtime::Matrix m = W.row_view(0, std::min<int64_t>(W.rows, 512));
  std::vector<float> x(static_cast<std::size_t>(m.cols), 0.25f), y(static_cast<std::size_t>(m.rows));
  const int reps = std::max<int>(1, static_cast<int>(2e8 / static_cast<double>(m.rows * m.cols)));
  double best = 1e30;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) t.matmul(x.data(), m.cols, 1, m, 0, m.rows, y.data(), m.rows);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / reps);
  }
  return static_cast<double>(m.rows * m.cols) / best / 1e9;
}

// Multiply-adds per second (x2: GOP/s) one core gets from a table in a 512-row product with W (x in L2):
// the prefill case, where the products are bound by arithmetic.
double products_rate(const runtime::cpu::KernelTable& t, const runtime::Matrix& W) {
  const int64_t M = 512;
  std::vector<float> x(static_cast<std::size_t>(M * W.cols)), y(static_cast<std::size_t>(M * W.rows));
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& v : x) v = u(rng);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = Clock::now();
    t.matmul(x.data(), W.cols, M, W, 0, W.rows, y.data(), W.rows);
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(M * W.rows * W.cols) / best / 1e9;
}

// One core's attention over a 2048-token prefill chunk, one KV head (2 query heads, head_dim 128, f32 KV), in
// GFLOP/s (4 x head_dim per query and key it sees): the FP32 kernels as CpuModel::attention runs them (blocks of 24
// rows of one head: scores, softmax, the weighted sums of the positions all rows see together, the rest alone),
// against kBf16Amx's attend where the CPU has it (on FMAs; on AMX tiles).
void attention_rates() {
  namespace cpu = runtime::cpu;
  const int64_t n = 2048, hd = 128, heads = 2, q_dim = heads * hd, height = 24;
  std::mt19937 rng(5);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<std::size_t>(n * q_dim)), k(static_cast<std::size_t>(n * hd)), v(k.size());
  for (auto* x : {&q, &k, &v})
    for (float& e : *x) e = g(rng);
  std::vector<float> out(q.size()), s(static_cast<std::size_t>(height * n));
  std::vector<const void*> keys(static_cast<std::size_t>(n)), values(keys.size());
  for (int64_t p = 0; p < n; ++p) keys[p] = k.data() + p * hd, values[p] = v.data() + p * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const auto fp32 = [&](const cpu::KernelTable& t) {
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r0 = 0; r0 < n; r0 += height) {
        const int64_t M = std::min(height, n - r0), count = r0 + M;
        t.dot_rows(q.data() + r0 * q_dim + h * hd, q_dim, M, runtime::DType::kF32, keys.data(), count, hd, s.data(),
                   count);
        for (int64_t m = 0; m < M; ++m) t.softmax(s.data() + m * count, r0 + m + 1, scale);
        float* o = out.data() + r0 * q_dim + h * hd;
        t.weighted_sum(s.data(), count, M, runtime::DType::kF32, values.data(), r0 + 1, hd, false, o, q_dim);
        for (int64_t m = 1; m < M; ++m)
          t.weighted_sum(s.data() + m * count + r0 + 1, count, 1, runtime::DType::kF32, values.data() + r0 + 1, m, hd,
                         true, o + m * q_dim, q_dim);
      }
  };
  const auto tiles = [&](const cpu::KernelTable& t) {
    const cpu::AttendTask task{q.data(), out.data(), q_dim, hd, n, heads, hd, 0, 0, 0, runtime::DType::kF32,
                               keys.data(), values.data(), scale};
    t.attend(task);
  };
  const auto rate = [&](auto&& run) {
    double best = 1e30;
    for (int r = 0; r < 3; ++r) {
      const auto t0 = Clock::now();
      run();
      best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
    return 4.0 * static_cast<double>(hd * heads) * static_cast<double>(n * (n + 1) / 2) / best / 1e9;
  };
  const double base = rate([&] { fp32(*cpu::avx512_kernels()); });
  std::printf("  one core, attention of a 2048-token chunk, one KV head: %5.1f GFLOP/s in FP32", base);
  if (const cpu::KernelTable* f = cpu::avx512_bf16amx_kernels()) {
    const double r = rate([&] { tiles(*f); });
    std::printf(", %5.1f bf16-amx on FMAs (%.2fx)", r, r / base);
  }
  if (const cpu::KernelTable* a = cpu::amx_bf16_kernels()) {
    const double r = rate([&] { tiles(*a); });
    std::printf(", %5.1f on AMX tiles (%.2fx)", r, r / base);
  }
  std::printf("\n");
}

// The decode kernels' own speed on the twins' first gate_proj: FP8 on the
// GFNI tiles against the AVX-512 table's (the same bits), INT8 beside them.
// Two cores at these rates against the triad say whether decode 1 can reach
// the memory's speed at all.
void codes_rates(const runtime::ModelWeights& bf16, const runtime::ModelWeights& fp8,
                 const runtime::ModelWeights& int8) {
  namespace cpu = runtime::cpu;
  if (!cpu::avx512_kernels()) return;
  attention_rates();
  {  // The prefill products of bf16 weights, one core: f32, bf16 dot products, bf16-amx on FMAs and on AMX tiles.
    const runtime::Matrix& W = bf16.layers[0].w_gate;
    std::printf("  one core, 512 rows x gate_proj, bf16 weights: %5.0f GOP/s in f32",
                products_rate(*cpu::avx512_kernels(), W));
    if (const cpu::KernelTable* b = cpu::avx512_bf16_kernels()) std::printf(", %5.0f bf16 dots", products_rate(*b, W));
    if (const cpu::KernelTable* f = cpu::avx512_bf16amx_kernels())
      std::printf(", %5.0f bf16-amx on FMAs", products_rate(*f, W));
    if (const cpu::KernelTable* a = cpu::amx_bf16_kernels()) std::printf(", %5.0f on AMX tiles", products_rate(*a, W));
    std::printf("\n");
  }
  const double plain = codes_rate(*cpu::avx512_kernels(), fp8.layers[0].w_gate);
  const double i8 = codes_rate(*cpu::avx512_kernels(), int8.layers[0].w_gate);
  // The prefill products of INT8 weights, one core: f32 arithmetic, INT8 activations on VNNI and on AMX.
  {
    const runtime::Matrix& W = int8.layers[0].w_gate;
    std::printf("  one core, 512 rows x gate_proj, int8 weights: %5.0f GOP/s in f32",
                products_rate(*cpu::avx512_kernels(), W));
    if (const cpu::KernelTable* v = cpu::avx512_vnni_kernels())
      std::printf(", %5.0f with INT8 activations", products_rate(*v, W));
    if (const cpu::KernelTable* a = cpu::avx512_amx_kernels()) std::printf(", %5.0f on AMX", products_rate(*a, W));
    std::printf("\n");
  }
  char w8a8[64] = "";  // INT8 weights under model.cpu_matmul = "int8", where the CPU has AVX512-VNNI
  if (const cpu::KernelTable* vnni = cpu::avx512_vnni_kernels())
    std::snprintf(w8a8, sizeof w8a8, " (%.1f with INT8 activations)", codes_rate(*vnni, int8.layers[0].w_gate));
  if (const cpu::KernelTable* a = cpu::amx_bf16_kernels() ? cpu::amx_bf16_kernels() : cpu::avx512_bf16amx_kernels())
    std::printf("  one core, one row, codes in L2: fp8 under bf16-amx (%s) %5.1f GB/s\n", a->name,
                codes_rate(*a, fp8.layers[0].w_gate));
  if (const cpu::KernelTable* g = cpu::avx512_gfni_kernels()) {
    const double gfni = codes_rate(*g, fp8.layers[0].w_gate);
    std::printf("  one core, one row, codes in L2: fp8 %5.1f GB/s on GFNI against %5.1f on the AVX-512 table "
                "(%.2fx); int8 %5.1f%s\n", gfni, plain, gfni / plain, i8, w8a8);
  } else {
    std::printf("  one core, one row, codes in L2: fp8 %5.1f GB/s, int8 %5.1f%s (no GFNI on this CPU)\n", plain, i8,
                w8a8);
  }
}

void quantized_figures(const std::string& bf16_dir, runtime::cpu::ThreadPool& threads, bool quick) {
  std::vector<Variant> vs;
  for (const char* scheme : {"", "fp8-block", "int8-channel"}) {
    Variant v;
    v.name = *scheme ? scheme : "bf16";
    const std::string dir = *scheme ? bf16_dir + "-" + scheme : bf16_dir;
    if (*scheme && !std::filesystem::exists(std::filesystem::path(dir) / "config.json")) {
      std::printf("quantizing the bench model (%s) into %s ...\n", scheme, dir.c_str());
      runtime::quantize_checkpoint({bf16_dir, dir, scheme});
    }
    v.c = runtime::ModelConfig::load(dir);
    v.w = runtime::ModelWeights::load(v.c, dir);
    v.step_bytes = step_weight_bytes(*v.w);
    v.held_bytes = held_bytes(*v.w);
    vs.push_back(std::move(v));
  }
  if (runtime::cpu::avx512_vnni_kernels()) {  // the INT8 twin again, activations quantized (model.cpu_matmul = "int8")
    Variant v;
    v.name = "int8 W8A8";
    v.mode = runtime::cpu::MatmulMode::kInt8Dot;
    v.c = vs.back().c;
    v.w = runtime::ModelWeights::load(v.c, bf16_dir + "-int8-channel");
    v.step_bytes = vs.back().step_bytes;
    v.held_bytes = vs.back().held_bytes;
    vs.push_back(std::move(v));
  }
  if (runtime::cpu::avx512_bf16amx_kernels()) {  // bf16 and FP8 under model.cpu_matmul = "bf16-amx"
    for (const int i : {0, 1}) {
      Variant v;
      v.name = vs[static_cast<std::size_t>(i)].name + " bf16-amx";
      v.mode = runtime::cpu::MatmulMode::kBf16Amx;
      v.c = vs[static_cast<std::size_t>(i)].c;
      v.w = vs[static_cast<std::size_t>(i)].w;
      v.step_bytes = vs[static_cast<std::size_t>(i)].step_bytes;
      v.held_bytes = vs[static_cast<std::size_t>(i)].held_bytes;
      vs.push_back(std::move(v));
    }
  }
  const int T = threads.size();
  double best_triad = 0;
  for (int r = 0; r < (quick ? 3 : 5); ++r) {
    for (auto& v : vs) {
      runtime::cpu::use_kernels(v.mode);  // the engine takes its table as it is made
      const double before = planner::triad_gbps(T);
      Run d = decode(v.c, *v.w, threads, 1, quick ? 8 : 24);
      const double after = planner::triad_gbps(T);
      best_triad = std::max({best_triad, before, after});
      v.ones.push_back({1, d, std::max(before, after)});
    }
  }
  for (auto& v : vs) {
    runtime::cpu::use_kernels(v.mode);
    v.decode32 = decode(v.c, *v.w, threads, 32, quick ? 8 : 24);
  }
  for (auto& v : vs) {
    runtime::cpu::use_kernels(v.mode);
    v.prefill = prefill(v.c, *v.w, threads, quick ? 1 : 2, kPrefillLen);
  }
  runtime::cpu::use_kernels(runtime::cpu::MatmulMode::kF32);
  std::printf("\n8-bit weights against bf16 (the bench model and its tandem quantize twins; the LM head stays bf16; "
              "int8 W8A8: the int8 twin under model.cpu_matmul = \"int8\"; bf16-amx: under model.cpu_matmul = "
              "\"bf16-amx\" on the %s table; KV as kv.dtype = \"auto\" holds it: bf16 under bf16-amx, else f32), "
              "round-robin:\n",
              runtime::cpu::amx_bf16_kernels() ? "amx-bf16" : "avx512-bf16amx");
  std::printf("  %-18s %10s %12s %22s %26s %12s %14s\n", "weights", "held MiB", "read/step MB", "decode 1 (tok/s, x)",
              "of 8-bit roofline (triad)", "decode 32", "prefill 512");
  // decode 1: each variant's median round by tokens/s against its own triad (the bandwidth-bound case); its x is
  // against bf16's round chosen the same way
  for (auto& v : vs)
    std::sort(v.ones.begin(), v.ones.end(), [&](const Decode& a, const Decode& b) {
      return tokens_per_s(a.run) / a.triad < tokens_per_s(b.run) / b.triad;
    });
  const double base1 = tokens_per_s(vs[0].ones[vs[0].ones.size() / 2].run);
  for (auto& v : vs) {
    const Decode& d = v.ones[v.ones.size() / 2];
    const double tps = tokens_per_s(d.run), gbps = v.step_bytes * tps / 1e9;
    std::printf("  %-18s %10.0f %12.0f %14.1f (%.2fx) %17.1f%% (%4.1f GB/s) %6.1f (%.2fx) %7.1f (%.2fx)\n",
                v.name.c_str(), v.held_bytes / (1 << 20), v.step_bytes / 1e6, tps, tps / base1, 100.0 * gbps / d.triad,
                d.triad, tokens_per_s(v.decode32), tokens_per_s(v.decode32) / tokens_per_s(vs[0].decode32),
                tokens_per_s(v.prefill), tokens_per_s(v.prefill) / tokens_per_s(vs[0].prefill));
  }
  // As for bf16 above: the fastest decode step against the best triad, the best of short intervals on both sides.
  for (const auto& v : vs) {
    double fastest = 1e30;
    for (const Decode& d : v.ones) fastest = std::min(fastest, d.run.fastest);
    const double gbps = v.step_bytes / fastest / 1e9;
    std::printf("  %-18s decode 1, its fastest step: %6.1f ms, %5.1f GB/s = %5.1f%% of the best triad (%.1f GB/s)\n",
                v.name.c_str(), 1e3 * fastest, gbps, 100.0 * gbps / best_triad, best_triad);
  }
  codes_rates(*vs[0].w, *vs[1].w, *vs[2].w);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parse_options(argc, argv, o)) {
    std::fprintf(stderr,
                 "usage: engine_bench [--model DIR] [--threads N] [--quick] [--quantized] "
                 "[--only prefill|prefill:LEN|decode:N|decode-sampled:N|decode-long:f32|bf16|fp8]\n");
    return 2;
  }
  try {
    const std::string model_dir = o.model_dir.empty() ? perf::bench_model() : o.model_dir;
    const auto c = runtime::ModelConfig::load(model_dir);
    const auto w = runtime::ModelWeights::load(c, model_dir);
    runtime::cpu::ThreadPool threads(o.threads);
    if (!o.only.empty()) {
      const bool pre = o.only.rfind("prefill", 0) == 0, sampled = o.only.rfind("decode-sampled:", 0) == 0;
      const bool deep = o.only.rfind("decode-long:", 0) == 0;
      const int64_t len = o.only.rfind("prefill:", 0) == 0 ? std::atol(o.only.c_str() + 8) : kPrefillLen;
      const Run r = pre    ? prefill(c, *w, threads, len > kPrefillLen ? 1 : 2, len)
                    : deep ? decode_long(c, *w, threads, o.quick,
                                         o.only == "decode-long:bf16" ? 2 : o.only == "decode-long:fp8" ? 1 : 4)
                           : decode(c, *w, threads, std::atol(o.only.c_str() + (sampled ? 15 : 7)), 96, sampled);
      std::printf("%s: %.1f tokens/s\n", o.only.c_str(), tokens_per_s(r));
      return 0;
    }
    print_figures(measure_all(c, *w, threads, o.quick), c, *w);
    if (o.quantized) {
      if (!o.model_dir.empty()) throw Error("--quantized measures the bench model's twins; leave out --model");
      quantized_figures(model_dir, threads, o.quick);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "engine_bench: %s\n", e.what());
    return 2;
  }
  return 0;
}
