#include <cfloat>

#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

constexpr int kThreads = 1024;

// One block per row: the largest value, ties to the lowest index; NaNs are
// skipped, except at index 0 (the host sampler's starting point), which wins.
__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float best_v[kThreads];
  __shared__ int32_t best_i[kThreads];
  const float* row = x + blockIdx.x * n;
  float v = -FLT_MAX;
  int32_t idx = -1;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    if (!isnan(row[i]) && (idx < 0 || row[i] > v)) v = row[i], idx = static_cast<int32_t>(i);
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int32_t oi = best_i[threadIdx.x + stride];
      const int32_t mi = best_i[threadIdx.x];
      if (oi >= 0 && (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  // As the host: it starts from index 0, and a NaN there is never beaten.
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0] < 0 || isnan(row[0]) ? 0 : best_i[0];
}

}  // namespace

void argmax(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
