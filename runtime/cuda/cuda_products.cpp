// CudaModel's products (cuda_model.h): cuBLAS for float32 and half-precision
// weights; for 8-bit weights products() (short), bf16 tiles on the tensor
// cores (long), or Hopper's FP8 units (long, model.gpu_matmul = "fp8"); and
// the FP8 units' block scales as the weights go up.
#include <algorithm>
#include <string>
#include <vector>

#include "common/error.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    case DType::kF8E4M3:
    case DType::kI8: break;  // products() multiplies 8-bit weights, never cuBLAS
  }
  return CUDA_R_32F;
}

}  // namespace

void CudaModel::upload_blocks(std::span<const Part> parts, const std::string& what, DevMatrix& d) {
  constexpr int64_t B = kFp8Group;
  d.blocks_ld = ((d.cols + B - 1) / B + 3) / 4 * 4;
  std::vector<float> grid(static_cast<std::size_t>((d.rows + B - 1) / B * d.blocks_ld), 0.0f);
  int64_t at = 0;  // the part's first row in d
  for (std::size_t i = 0; i < parts.size(); ++i) {
    const Part& p = parts[i];
    const Scales& s = p.m->scales;
    const int64_t rows = (p.r1 < 0 ? p.m->rows : p.r1) - p.r0;
    // Whole blocks: the part starts on a block's first row and column, fills its last block row unless it is
    // d's last part, and the width is whole blocks (cuBLASLt's grid starts at (0, 0) and steps by 128).
    if (s.block_rows != B || s.block_cols != B || (p.r0 + s.r0) % B != 0 || (p.c0 + s.c0) % B != 0 ||
        d.cols % B != 0 || d.rows % 4 != 0 || (i + 1 < parts.size() && rows % B != 0))
      throw Error("model.gpu_matmul = \"fp8\" needs whole 128x128 blocks, but " + what + " on this rank is " +
                  std::to_string(rows) + " rows from row " + std::to_string(p.r0) + " by " + std::to_string(d.cols) +
                  " columns from column " + std::to_string(p.c0) + " of blocks of " + std::to_string(s.block_rows) + "x" +
                  std::to_string(s.block_cols) + " (a tensor-parallel width that cuts a block, or a dimension that is "
                  "not a multiple of 128); use \"auto\"");
    for (int64_t r = 0; r < rows; r += B)
      for (int64_t c = 0; c < d.cols; c += B)
        grid[static_cast<std::size_t>((at + r) / B * d.blocks_ld + c / B)] = s.at(p.r0 + r, p.c0 + c);
    at += rows;
  }
  d.blocks.resize(grid.size());
  TANDEM_CUDA_CHECK(cudaMemcpy(d.blocks.get(), grid.data(), grid.size() * sizeof(float), cudaMemcpyHostToDevice));
}

const void* CudaModel::input_for(const DevMatrix& w, const float* x, int64_t rows) {
  if (w.input() == DType::kF32) return x;
  // Tensor cores take both inputs in the weights' type.
  to_half(x, rows * w.cols, w.dtype, act_.get(), stream_);
  return act_.get();
}

void CudaModel::product(const DevMatrix& w, const float* x, int64_t rows, float* y) {
  Product p;
  p.in = x;
  p.w = w.data.get(), p.w_dtype = w.dtype, p.scales = w.scales(), p.n = w.rows, p.k = w.cols;
  p.out = y, p.rows = rows;
  products(p, RowGroups{}, 1, product_tiles(rows, 1), stream_);
}

void CudaModel::blas_gemm(const void* w, cudaDataType_t t, cublasComputeType_t compute, int64_t n, int64_t k,
                          const void* x, int64_t rows, float* y, int64_t ldy) {
  // Row-major y[rows][n] = x[rows][k] W^T with W [n][k] is, in cuBLAS's
  // column-major terms, y^T (n x rows) = W^T(k x n)^T * x^T (k x rows).
  const float alpha = 1.0f, beta = 0.0f;
  TANDEM_CUBLAS_CHECK(cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(rows),
                                   static_cast<int>(k), &alpha, w, t, static_cast<int>(k), x, t, static_cast<int>(k), &beta,
                                   y, CUDA_R_32F, static_cast<int>(ldy), compute, CUBLAS_GEMM_DEFAULT));
}

void CudaModel::gemm(const DevMatrix& w, const void* x, int64_t rows, float* y) {
  if (rows == 0) return;
  if (w.quantized()) {  // codes and scales: ours, or a long product on the tensor cores
    const auto* in = static_cast<const float*>(x);
    if (rows >= kDequantRows && fp8_ && w.blocks.size()) return fp8_product(w, in, rows, y);
    if (rows >= kDequantRows && tc_8bit_) return dequantized_gemm(w, in, rows, y);
    return product(w, in, rows, y);
  }
  blas_gemm(w.data.get(), cuda_type(w.dtype), w.dtype == DType::kF32 ? CUBLAS_COMPUTE_32F_PEDANTIC : CUBLAS_COMPUTE_32F,
            w.rows, w.cols, x, rows, y, w.rows);
}

int64_t CudaModel::dequant_tile_rows(int64_t cols) {
  return std::max<int64_t>(128, static_cast<int64_t>(kDequantTileBytes) / (2 * std::max<int64_t>(1, cols)) / 128 * 128);
}

void CudaModel::fp8_product(const DevMatrix& w, const float* x, int64_t rows, float* y) {
  quantize_groups_fp8(x, rows, w.cols, act8_.get(), act8_scales_.get(), stream_);
  // cuBLASLt takes the rows in eights: y's buffers have room for the padding rows' (zero) outputs (launch()).
  fp8_->run(w.data.get(), w.blocks.get(), w.blocks_ld, w.rows, w.cols, act8_.get(), act8_scales_.get(),
            fp8_scale_ld(rows), y, w.rows, stream_);
}

void CudaModel::dequantized_gemm(const DevMatrix& w, const float* x, int64_t rows, float* y) {
  to_half(x, rows * w.cols, DType::kBF16, act16_.get(), stream_);
  const int64_t tile = dequant_tile_rows(w.cols);
  for (int64_t n0 = 0; n0 < w.rows; n0 += tile) {  // the stream orders each tile's product before the next's dequantize
    const int64_t n = std::min(tile, w.rows - n0);
    dequantize_bf16(w.data.get(), w.dtype, w.scales(), n0, n, w.cols, wtile_.get(), stream_);
    blas_gemm(wtile_.get(), CUDA_R_16BF, CUBLAS_COMPUTE_32F, n, w.cols, act16_.get(), rows, y + n0, w.rows);
  }
}

}  // namespace tandem::runtime::cuda
