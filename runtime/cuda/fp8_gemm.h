// Products on Hopper's FP8 tensor cores (model.gpu_matmul = "fp8"): y = x W^T
// for W an FP8 E4M3 checkpoint's codes in 128x128 blocks, each block with
// its float32 scale (weight_scale_inv: W = code x scale), and x quantized to
// E4M3 per row and 128 columns (ops.h quantize_groups_fp8), through
// cuBLASLt's block-scaled matmul (CUDA 12.9+: A's scales
// CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, B's VEC128_32F), float32 out.
// The DeepSeek-V3 recipe, as vLLM and SGLang serve these checkpoints; not
// the CPU's weight-only arithmetic (docs/quantization.md).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace tandem::runtime::cuda {

class Fp8Gemm {
 public:
  // cuBLASLt's workspace: device memory of `bytes`, used on the products' stream only.
  Fp8Gemm(void* workspace, std::size_t bytes);
  ~Fp8Gemm();
  Fp8Gemm(const Fp8Gemm&) = delete;
  Fp8Gemm& operator=(const Fp8Gemm&) = delete;

  // Why the current device cannot run these products ("" when it can): block-scaled FP8 is Hopper's (9.x).
  static std::string unsupported();

  // y (ldy floats a row) = x W^T, x: codes [rows][k] with scales [k / 128][rows] (quantize_groups_fp8, its rows
  // padded: rows a multiple of 8, and y has room for them); W: codes [n][k], scales [ceil(n / 128)][w_scale_ld]
  // (ld a multiple of 4, at least k / 128). k a multiple of 128, n of 4. Throws if cuBLASLt has no algorithm
  // for the shape here.
  void run(const uint8_t* w, const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, const uint8_t* x,
           const float* x_scales, int64_t rows, float* y, int64_t ldy, cudaStream_t stream);
  // Asks cuBLASLt now for the algorithm of a product of `rows` rows with W (as run() takes it): a shape it has
  // none for stops the model's load, not its first long step. Throws as run() does.
  void prepare(const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, int64_t rows);

 private:
  struct Call;
  // c described for y (ldy floats a row) = x W^T, the scale pointers as given; its algorithm, found once.
  void describe(Call& c, const float* w_scales, int64_t w_scale_ld, int64_t n, int64_t k, const float* x_scales,
                int64_t rows, int64_t ldy) const;
  const cublasLtMatmulAlgo_t& algo(Call& c, int64_t n, int64_t k, int64_t rows);

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_;
  std::size_t workspace_bytes_;
  // The heuristic's algorithm for each (n, k, rows) met so far: it costs tens of microseconds a query, four
  // products a layer ask for one, and the scale pointers it does not depend on change from layer to layer.
  std::map<std::array<int64_t, 3>, cublasLtMatmulAlgo_t> algos_;
};

}  // namespace tandem::runtime::cuda
