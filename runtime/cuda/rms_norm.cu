#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void rms_norm_kernel(const float* x, const float* w, int64_t n, float eps, float* y) {
  __shared__ float partial[kThreads / 32];
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) ss += xr[i] * xr[i];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    ss = threadIdx.x < kThreads / 32 ? partial[threadIdx.x] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    if (threadIdx.x == 0) partial[0] = ss;
  }
  __syncthreads();
  const float r = 1.0f / sqrtf(partial[0] / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) yr[i] = w[i] * (xr[i] * r);
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t rows, int64_t n, float eps, float* y, cudaStream_t stream) {
  if (rows == 0) return;
  rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, w, n, eps, y);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
