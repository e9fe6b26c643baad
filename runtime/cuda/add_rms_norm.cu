// The residual add and the RMSNorm after it in one pass over the row, the
// normed row written in the type of the product that takes it.
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void add_rms_norm_kernel(float* x, const float* y, const float* bias, const float* w, int64_t n, float eps,
                                    DType out_type, void* out) {
  __shared__ float partial[kThreads / 32];
  float* xr = x + blockIdx.x * n;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) {
    float v = xr[i];
    if (y) {
      v += bias ? y[blockIdx.x * n + i] + bias[i] : y[blockIdx.x * n + i];
      xr[i] = v;  // read back below by this same thread only
    }
    ss += v * v;
  }
  ss = block_sum(ss, partial);
  const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += kThreads) store_as(out, blockIdx.x * n + i, w[i] * (xr[i] * r), out_type);
}

}  // namespace

void add_rms_norm(float* x, const float* y, const float* bias, const float* w, int64_t rows, int64_t n, float eps,
                  DType out_type, void* out, cudaStream_t stream) {
  if (rows == 0) return;
  add_rms_norm_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, y, bias, w, n, eps, out_type, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
