// 8-bit checkpoints on the CUDA backend against the CPU reference: the
// weights stay 8-bit on the device; short products multiply code x scale in
// float32 (the CPU's arithmetic), long ones (a prefill of kDequantRows rows
// or more) turn the weights' values into bf16 a tile at a time and run on the
// tensor cores. Needs a GPU (main() in cuda_backend_test.cpp skips without one).
#include <catch2/catch.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/cpu/cpu_model.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/ops.h"
#include "runtime/model/dtype.h"
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
    const std::filesystem::path dir = tiny.dir.string() + "-" + scheme;
    quantize_checkpoint({tiny.dir, dir, scheme});
    const auto config = ModelConfig::load(dir);
    const auto panels = ModelWeights::load(config, dir), rowmajor = ModelWeights::load(config, dir, false);
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(40);
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 1000);
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16, 4}, 8);
    cpu::CpuModel cpu_model(config, *panels, cpu_pool, threads);
    const auto want = testing::chunked_logits(cpu_model, cpu_pool, prompt);
    DevPool dev(config, 8, 4);
    std::unique_ptr<cu::CudaModel> gpu;
    const double held = testing::device_bytes_of([&] {
      gpu = std::make_unique<cu::CudaModel>(config, *rowmajor, *dev.pool);
      return 0;
    });
    const auto got = testing::chunked_logits(*gpu, *dev.pool, prompt);
    REQUIRE(got.size() == want.size());
    const double err = rel_err(got, want);
    std::printf("cuda %s %s: largest logit difference from the CPU engine %.3g (relative); the model takes %.1f MiB of "
                "device memory\n", arch, scheme, err, held / (1 << 20));
    CHECK(err < 1e-4);
    std::filesystem::remove_all(dir);
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
    const std::filesystem::path dir = tiny.dir.string() + "-" + scheme;
    quantize_checkpoint({tiny.dir, dir, scheme});
    const auto config = ModelConfig::load(dir);
    const auto panels = ModelWeights::load(config, dir), rowmajor = ModelWeights::load(config, dir, false);
    cpu::ThreadPool threads(2);
    kv::BlockPool cpu_pool({config.layers, config.kv_heads, config.head_dim, 16, 4}, 8);
    cpu::CpuModel cpu_model(config, *panels, cpu_pool, threads);
    const std::vector<float> want = one_step_logits(cpu_model, cpu_pool, prompt);
    for (const bool tc : {true, false}) {
      const char* road = tc ? "tensor cores (bf16 values)" : "code x scale in float32";
      INFO(road);
      const Tc8bit env(tc);
      DevPool dev(config, 8, 4);
      cu::CudaModel gpu(config, *rowmajor, *dev.pool);
      const std::vector<float> got = one_step_logits(gpu, *dev.pool, prompt);
      REQUIRE(got.size() == want.size());
      const double err = rel_err(got, want);
      std::printf("cuda %s, one step of %zu rows, %s: largest logit difference from the CPU engine %.3g\n", scheme,
                  prompt.size(), road, err);
      CHECK(err < (tc ? 3e-2 : 1e-4));
      if (tc) CHECK(err > 1e-6);  // it did leave the float32 path: bf16 values are not the CPU's
    }
    std::filesystem::remove_all(dir);
  }
}
