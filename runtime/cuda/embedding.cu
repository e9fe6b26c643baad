#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

__global__ void embedding_kernel(const void* table, int dtype, const int32_t* tokens, int64_t hidden, float* out) {
  const int64_t r = blockIdx.x;
  const int64_t base = static_cast<int64_t>(tokens[r]) * hidden;
  for (int64_t i = threadIdx.x; i < hidden; i += blockDim.x) {
    float v;
    if (dtype == static_cast<int>(DType::kF32)) v = static_cast<const float*>(table)[base + i];
    else if (dtype == static_cast<int>(DType::kBF16)) v = __bfloat162float(static_cast<const __nv_bfloat16*>(table)[base + i]);
    else v = __half2float(static_cast<const __half*>(table)[base + i]);
    out[r * hidden + i] = v;
  }
}

}  // namespace

void embedding(const void* table, DType dtype, const int32_t* tokens, int64_t rows, int64_t hidden, float* out,
               cudaStream_t stream) {
  if (rows == 0) return;
  embedding_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(table, static_cast<int>(dtype), tokens, hidden, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
