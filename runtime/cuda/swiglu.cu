#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

__global__ void swiglu_kernel(const float* gate_up, int64_t rows, int64_t n, DType out_type, void* out) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= rows * n) return;
  const int64_t r = e / n, i = e % n;
  const float g = gate_up[r * 2 * n + i], u = gate_up[r * 2 * n + n + i];
  store_as(out, e, g * (1.0f / (1.0f + expf(-g))) * u, out_type);
}

}  // namespace

void swiglu(const float* gate_up, int64_t rows, int64_t n, DType out_type, void* out, cudaStream_t stream) {
  if (rows * n == 0) return;
  swiglu_kernel<<<blocks_for(rows * n, 256), 256, 0, stream>>>(gate_up, rows, n, out_type, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
