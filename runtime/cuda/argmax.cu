#include "runtime/cuda/argmax.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

__global__ void argmax_kernel(const float* x, int64_t n, int32_t* out) {
  const int32_t best = block_argmax(x + blockIdx.x * n, n);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

}  // namespace

void argmax(const float* x, int64_t rows, int64_t n, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  argmax_kernel<<<static_cast<unsigned>(rows), kArgmaxThreads, 0, stream>>>(x, n, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
