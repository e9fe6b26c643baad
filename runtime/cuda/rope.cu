#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

// One block per row; thread i rotates pair (i, i + half) of every head.
__global__ void rope_kernel(float* x, const int32_t* positions, int64_t heads, int64_t head_dim, const float* inv_freq) {
  const int64_t r = blockIdx.x, half = head_dim / 2;
  const float p = static_cast<float>(positions[r]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = p * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = static_cast<float>(sin(static_cast<double>(angle)));
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + (r * heads + h) * head_dim;
      const float a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

void rope(float* x, const int32_t* positions, int64_t rows, int64_t heads, int64_t head_dim, const float* inv_freq,
          cudaStream_t stream) {
  if (rows == 0) return;
  rope_kernel<<<static_cast<unsigned>(rows), 64, 0, stream>>>(x, positions, heads, head_dim, inv_freq);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
