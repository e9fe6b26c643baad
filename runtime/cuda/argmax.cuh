// The largest value of a row and its index, by one block of kArgmaxThreads
// threads: ties to the lowest index; NaNs are skipped, except at index 0 (the
// host sampler's starting point), which wins. Every thread gets the answer.
#pragma once

#include <cfloat>
#include <cstdint>

namespace tandem::runtime::cuda {

inline constexpr int kArgmaxThreads = 1024;

__device__ inline int32_t block_argmax(const float* row, int64_t n) {
  __shared__ float best_v[kArgmaxThreads];
  __shared__ int32_t best_i[kArgmaxThreads];
  float v = -FLT_MAX;
  int32_t idx = -1;
  for (int64_t i = threadIdx.x; i < n; i += kArgmaxThreads)
    if (!isnan(row[i]) && (idx < 0 || row[i] > v)) v = row[i], idx = static_cast<int32_t>(i);
  __syncthreads();  // the arrays may still be read by an earlier call
  best_v[threadIdx.x] = v;
  best_i[threadIdx.x] = idx;
  __syncthreads();
  for (int stride = kArgmaxThreads / 2; stride > 0; stride >>= 1) {
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
  return best_i[0] < 0 || isnan(row[0]) ? 0 : best_i[0];
}

}  // namespace tandem::runtime::cuda
