#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

__global__ void swiglu_kernel(float* gate, const float* up, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  gate[i] = g * (1.0f / (1.0f + expf(-g))) * up[i];
}

}  // namespace

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, stream>>>(gate, up, n);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
