// Small elementwise operations between the big ones: the last residual, the
// half-precision copy of a GEMM's input, gathering the rows that want logits.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void to_bf16_kernel(const float* x, int64_t n, __nv_bfloat16* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(x[i]);
}

__global__ void to_f16_kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// Level by level: v[j] += v[j + stride] for j a multiple of 2 * stride.
__global__ void sum_parts_kernel(const float* parts, int count, int64_t n, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  float v[8];
  for (int p = 0; p < count; ++p) v[p] = parts[p * n + i];
  for (int stride = 1; stride < count; stride *= 2)
    for (int j = 0; j + stride < count; j += 2 * stride) v[j] = __fadd_rn(v[j], v[j + stride]);
  out[i] = v[0];
}

__global__ void gather_rows_kernel(const float* x, const int32_t* rows, int64_t width, float* out) {
  const int64_t r = blockIdx.x;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) out[r * width + i] = x[rows[r] * width + i];
}

}  // namespace

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  add_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, y, n);
  TANDEM_CUDA_LAUNCHED();
}

void sum_parts(const float* parts, int count, int64_t n, float* out, cudaStream_t stream) {
  if (n == 0) return;
  if (count != 1 && count != 2 && count != 4 && count != 8)
    throw Error("internal: a tensor-parallel sum of " + std::to_string(count) + " parts (1, 2, 4 or 8)");
  sum_parts_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(parts, count, n, out);
  TANDEM_CUDA_LAUNCHED();
}

void to_half(const float* x, int64_t n, DType dtype, void* out, cudaStream_t stream) {
  if (n == 0) return;
  if (dtype == DType::kBF16) to_bf16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(out));
  else to_f16_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(x, n, static_cast<__half*>(out));
  TANDEM_CUDA_LAUNCHED();
}

void gather_rows(const float* x, const int32_t* rows, int64_t n_rows, int64_t width, float* out, cudaStream_t stream) {
  if (n_rows == 0) return;
  gather_rows_kernel<<<static_cast<unsigned>(n_rows), 256, 0, stream>>>(x, rows, width, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
