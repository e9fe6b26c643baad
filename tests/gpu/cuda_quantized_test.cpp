// 8-bit checkpoints on the CUDA backend against the CPU reference: the
// weights stay 8-bit on the device; short products multiply code x scale in
// float32 (the CPU's arithmetic), long ones (a prefill of kDequantRows rows
// or more) turn the weights' values into bf16 a tile at a time and run on the
// tensor cores, or with model.gpu_matmul = "fp8" quantize their input for
// Hopper's FP8 units (those tests say "skipped" elsewhere). Needs a GPU
// (main() in cuda_backend_test.cpp skips without one).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/kernels.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/device_buffer.h"
#include "runtime/cuda/fp8_gemm.h"
#include "runtime/cuda/ops.h"
#include "runtime/model/dtype.h"
#include "runtime/model/make_model.h"
#include "runtime/model/quantize.h"
#include "../unit/runtime/test_model.h"
#include "gpu_helpers.h"

using namespace tandem;
using namespace tandem::runtime;
namespace cu = tandem::runtime::cuda;
using tandem::testing::Dev;
using tandem::testing::DevPool;
using tandem::testing::rel_err;

namespace {

// Every logit of one step that prefills all of `prompt` at once (a long product's rows).
std::vector<float> one_step_logits(ModelBackend& m, kv::BlockPool& pool, const std::vector<int32_t>& prompt) {
  auto blocks = *pool.allocate((static_cast<int64_t>(prompt.size()) + 15) / 16);
  SeqChunk c;
  c.tokens = prompt;
  c.block_table = blocks;
  c.logits_all = true;
  std::vector<float> logits;
  m.forward(std::span<const SeqChunk>(&c, 1), logits);
  pool.release(blocks);
  return logits;
}

// TANDEM_CUDA_TC_8BIT for the models made while it lives.
struct Tc8bit {
  explicit Tc8bit(bool on) { ::setenv("TANDEM_CUDA_TC_8BIT", on ? "1" : "0", 1); }
  ~Tc8bit() { ::unsetenv("TANDEM_CUDA_TC_8BIT"); }
};

}  // namespace

TEST_CASE("dequantize_bf16: each 8-bit weight's value (code x its block's scale) rounded to bf16, bit for bit", "[gpu]") {
  // 50 rows of 300 columns whose first column sits 37 into a block of 128 (a rank's shard of a row-parallel
  // product): a row's scales cross three blocks. Rows [5, 45) are asked for.
  const int64_t N = 50, K = 300, block = 128, offset = 37, ld = (K + offset + block - 1) / block, n0 = 5, n = 40;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(static_cast<std::size_t>(N * K));
  for (auto& c : codes) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;  // not NaN (checkpoints hold none)
  }
  const std::vector<float> grid = testing::random_floats(static_cast<std::size_t>(N * ld), 4, 0.01f);
  const Dev<uint8_t> d_codes(codes);
  const Dev<float> d_grid(grid);
  const cu::ProductScales s{d_grid.p, ld, block, offset};
  for (const DType dtype : {DType::kF8E4M3, DType::kI8}) {
    INFO(dtype_name(dtype));
    const Dev<uint16_t> out(std::vector<uint16_t>(static_cast<std::size_t>(n * K), 0));
    cu::dequantize_bf16(d_codes.p, dtype, s, n0, n, K, out.p, nullptr);
    const std::vector<uint16_t> got = out.get(static_cast<std::size_t>(n * K));
    int64_t wrong = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const uint8_t c = codes[static_cast<std::size_t>((n0 + r) * K + k)];
        const float code = dtype == DType::kF8E4M3 ? f8e4m3_to_f32(c) : static_cast<float>(static_cast<int8_t>(c));
        const float value = code * grid[static_cast<std::size_t>((n0 + r) * ld + (k + offset) / block)];
        wrong += got[static_cast<std::size_t>(r * K + k)] != f32_to_bf16(value);
      }
    CHECK(wrong == 0);
  }
}

TEST_CASE("an 8-bit checkpoint (FP8 blocks, INT8 channels; dense and MoE) gives the CPU engine's logits (< 1e-4: both "
          "on code x scale), its weights 8-bit on the device",
          "[gpu]") {
  for (const char* arch : {"qwen3", "qwen3_moe"})
  for (const char* scheme : {"fp8-block", "int8-channel"}) {
    testing::TinyModel tiny(arch, "f32");  // f32 embedding and LM head: cuBLAS in pedantic f32, the SIMT attention
    INFO(arch << " " << scheme);
    const testing::QuantizedModel q(tiny.dir, scheme);
    const ModelConfig& config = q.config;
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16, 4}, 8);
    cpu::CpuModel cpu_model(config, *q.panels, cpu_pool, threads);
    const auto want = testing::chunked_logits(cpu_model, cpu_pool, prompt);
    DevPool dev(config, 8, 4);
    std::unique_ptr<cu::CudaModel> gpu;
    const double held = testing::device_bytes_of([&] {
      gpu = std::make_unique<cu::CudaModel>(config, *q.rowmajor, *dev.pool);
      return 0;
    });
    const auto got = testing::chunked_logits(*gpu, *dev.pool, prompt);
    REQUIRE(got.size() == want.size());
    const double err = rel_err(got, want);
    std::printf("cuda %s %s: largest logit difference from the CPU engine %.3g (relative); the model takes %.1f MiB of "
                "device memory\n", arch, scheme, err, held / (1 << 20));
    CHECK(err < 1e-4);
  }
}

TEST_CASE("an 8-bit checkpoint's long prefill runs on the tensor cores (bf16 values, < 3e-2 of the CPU engine); "
          "TANDEM_CUDA_TC_8BIT=0 keeps the CPU's arithmetic (< 1e-4)",
          "[gpu]") {
  testing::TinyModel tiny("qwen3", "f32");
  std::mt19937 rng(8);
  std::vector<int32_t> prompt(static_cast<std::size_t>(cu::CudaModel::kDequantRows + 36));  // one step of 100 rows
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
  for (const char* scheme : {"fp8-block", "int8-channel"}) {
    INFO(scheme);
    const testing::QuantizedModel q(tiny.dir, scheme);
    const ModelConfig& config = q.config;
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16, 4}, 8);
    cpu::CpuModel cpu_model(config, *q.panels, cpu_pool, threads);
    const std::vector<float> want = one_step_logits(cpu_model, cpu_pool, prompt);
    for (const bool tc : {true, false}) {
      const char* road = tc ? "tensor cores (bf16 values)" : "code x scale in float32";
      INFO(road);
      const Tc8bit env(tc);
      DevPool dev(config, 8, 4);
      cu::CudaModel gpu(config, *q.rowmajor, *dev.pool);
      const std::vector<float> got = one_step_logits(gpu, *dev.pool, prompt);
      REQUIRE(got.size() == want.size());
      const double err = rel_err(got, want);
      std::printf("cuda %s, one step of %zu rows, %s: largest logit difference from the CPU engine %.3g\n", scheme,
                  prompt.size(), road, err);
      CHECK(err < (tc ? 3e-2 : 1e-4));
      if (tc) CHECK(err > 1e-6);  // it did leave the float32 path: bf16 values are not the CPU's
    }
  }
}

TEST_CASE("quantize_groups_fp8: each row's groups of 128 columns as the CPU's quantize_fp8_row makes them; rows "
          "padded to a multiple of 8 with zeros",
          "[gpu]") {
  const int64_t rows = 5, k = 384, ld = cu::fp8_scale_ld(rows);  // 5 rows: 8 of codes and scales
  std::vector<float> x = testing::random_floats(static_cast<std::size_t>(rows * k), 6, 3.0f);
  for (int64_t c = 128; c < 256; ++c) x[static_cast<std::size_t>(2 * k + c)] = 0.0f;  // an all-zero group
  x[static_cast<std::size_t>(4 * k + 7)] = 1e-30f;                                     // and a tiny value
  const Dev<float> d_x(x);
  const Dev<uint8_t> codes(std::vector<uint8_t>(static_cast<std::size_t>(ld * k), 0xAA));
  const Dev<float> scales(std::vector<float>(static_cast<std::size_t>(k / 128 * ld), -1.0f));
  cu::quantize_groups_fp8(d_x.p, rows, k, codes.p, scales.p, nullptr);
  const auto got = codes.get(static_cast<std::size_t>(ld * k));
  const auto got_scales = scales.get(static_cast<std::size_t>(k / 128 * ld));
  int64_t wrong = 0;
  for (int64_t r = rows; r < ld; ++r) {  // the padding: zero codes, scale 0
    for (int64_t c = 0; c < k; ++c) wrong += got[static_cast<std::size_t>(r * k + c)] != 0;
    for (int64_t g = 0; g < k / 128; ++g) wrong += got_scales[static_cast<std::size_t>(g * ld + r)] != 0.0f;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < k / 128; ++g) {
      std::vector<uint8_t> want(128 + sizeof(float));
      cpu::quantize_fp8_row(x.data() + r * k + g * 128, 128, want.data());
      float scale = 0;
      std::memcpy(&scale, want.data() + 128, sizeof scale);
      wrong += got_scales[static_cast<std::size_t>(g * ld + r)] != scale;
      for (int64_t c = 0; c < 128; ++c) wrong += got[static_cast<std::size_t>(r * k + g * 128 + c)] != want[static_cast<std::size_t>(c)];
    }
  CHECK(wrong == 0);
}

// model.gpu_matmul = "fp8": cuBLASLt's block-scaled FP8 product against the same arithmetic on the host in
// double (x quantized per row and 128 columns as quantize_fp8_row, W's codes times their blocks' scales),
// for row counts that are and are not a multiple of 4 (padded to one: cuBLASLt takes rows in fours), a
// weight of 2.5 block rows and 3 block columns (its scale rows padded to 4). Hopper only.
TEST_CASE("Fp8Gemm: the FP8 tensor cores' product of 128x128-block weights and 1x128-group activations", "[gpu]") {
  if (const std::string why = cu::Fp8Gemm::unsupported(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return;
  }
  const int64_t n = 320, k = 384, nb = (n + 127) / 128, kb = k / 128, w_ld = (kb + 3) / 4 * 4;
  std::mt19937 rng(9);
  std::vector<uint8_t> w(static_cast<std::size_t>(n * k));
  for (auto& c : w) {
    c = static_cast<uint8_t>(rng());
    if ((c & 0x7F) == 0x7F) c ^= 1;
  }
  std::vector<float> w_scales(static_cast<std::size_t>(nb * w_ld), 0.0f);
  for (int64_t i = 0; i < nb; ++i)
    for (int64_t j = 0; j < kb; ++j) w_scales[static_cast<std::size_t>(i * w_ld + j)] = 1e-3f * static_cast<float>(1 + (i * 7 + j * 3) % 11);
  const Dev<uint8_t> d_w(w);
  const Dev<float> d_ws(w_scales);
  cu::DeviceBuffer<uint8_t> workspace(std::size_t{32} << 20);
  cu::Fp8Gemm gemm(workspace.get(), workspace.size());
  for (const int64_t rows : {int64_t{66}, int64_t{70}, int64_t{128}}) {
    INFO(rows << " rows");
    const std::vector<float> x = testing::random_floats(static_cast<std::size_t>(rows * k), 10 + static_cast<uint32_t>(rows));
    const int64_t ld = cu::fp8_scale_ld(rows);  // the rows cuBLASLt multiplies
    const Dev<float> d_x(x);
    const Dev<uint8_t> codes(std::vector<uint8_t>(static_cast<std::size_t>(ld * k), 0));
    const Dev<float> scales(std::vector<float>(static_cast<std::size_t>(kb * ld), 0.0f));
    const Dev<float> y(std::vector<float>(static_cast<std::size_t>(ld * n), 0.0f));
    cu::quantize_groups_fp8(d_x.p, rows, k, codes.p, scales.p, nullptr);
    gemm.run(d_w.p, d_ws.p, w_ld, n, k, codes.p, scales.p, ld, y.p, n, nullptr);
    const auto got = y.get(static_cast<std::size_t>(ld * n));
    const auto xc = codes.get(static_cast<std::size_t>(ld * k));
    const auto xs = scales.get(static_cast<std::size_t>(kb * ld));
    double worst = 0, largest = 0;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t o = 0; o < n; ++o) {
        double want = 0;
        for (int64_t g = 0; g < kb; ++g) {
          double part = 0;
          for (int64_t c = g * 128; c < (g + 1) * 128; ++c)
            part += static_cast<double>(f8e4m3_to_f32(xc[static_cast<std::size_t>(r * k + c)])) *
                    f8e4m3_to_f32(w[static_cast<std::size_t>(o * k + c)]);
          want += part * xs[static_cast<std::size_t>(g * ld + r)] * w_scales[static_cast<std::size_t>(o / 128 * w_ld + g)];
        }
        worst = std::max(worst, std::fabs(want - got[static_cast<std::size_t>(r * n + o)]));
        largest = std::max(largest, std::fabs(want));
      }
    std::printf("Fp8Gemm, %ld rows: largest difference from the host's %.3g of the largest output %.3g\n",
                static_cast<long>(rows), worst, largest);
    CHECK(worst < 1e-3 * largest);  // float32 sums of exact FP8 products; a wrong scale layout is off by O(1)
  }
}

TEST_CASE("model.gpu_matmul = \"fp8\": an FP8-block checkpoint's prefill on the FP8 tensor cores stays near the CPU "
          "engine's logits, its short steps exactly the CPU's arithmetic",
          "[gpu]") {
  if (const std::string why = cu::Fp8Gemm::unsupported(); !why.empty()) {
    std::printf("skipped: %s\n", why.c_str());
    return;
  }
  MakeModelOptions o;
  o.arch = "qwen3", o.preset = "small", o.dtype = "f32", o.seed = 12;  // hidden 256, q 256, kv 128, units 768: whole blocks
  o.tokenizer_dir = testing::tokenizer_dir("qwen3");
  o.out_dir = std::filesystem::temp_directory_path() / ("tandem-gpu-fp8mm-" + std::to_string(::getpid()));
  make_model(o);
  const testing::QuantizedModel q(o.out_dir, "fp8-block");
  ModelConfig config = q.config;
  std::mt19937 rng(13);
  std::vector<int32_t> prompt(static_cast<std::size_t>(cu::CudaModel::kDequantRows + 37));  // 101 rows: padded to 104
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
  cpu::ThreadPool threads(2);
  kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16, 4}, 16);
  cpu::CpuModel cpu_model(config, *q.panels, cpu_pool, threads);
  const std::vector<float> want = one_step_logits(cpu_model, cpu_pool, prompt);
  const std::vector<float> want_short = testing::chunked_logits(cpu_model, cpu_pool, prompt);
  config.gpu_matmul = "fp8";
  DevPool dev(config, 16, 4);
  cu::CudaModel gpu(config, *q.rowmajor, *dev.pool);
  const double err = rel_err(one_step_logits(gpu, *dev.pool, prompt), want);
  const double err_short = rel_err(testing::chunked_logits(gpu, *dev.pool, prompt), want_short);
  std::printf("cuda fp8 block, model.gpu_matmul = fp8: one step of %zu rows %.3g from the CPU engine's logits; steps "
              "of 20 rows and fewer %.3g\n", prompt.size(), err, err_short);
  CHECK(err < 1e-1);  // activations in E4M3: 3 bits of mantissa where the CPU keeps 24
  CHECK(err > 1e-6);  // and it did quantize them
  CHECK(err_short < 1e-4);  // under 64 rows: products(), code x scale in float32
  std::filesystem::remove_all(o.out_dir);
}
