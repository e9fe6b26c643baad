// Writing a float result in the type the next product (or the KV pool)
// takes: float32, or bf16/f16 rounded to nearest even, as the CPU's
// f32_to_bf16 and to_half(); and reading a KV element back.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "runtime/model/dtype.h"

namespace tandem::runtime::cuda {

__device__ inline void store_as(void* out, int64_t i, float v, DType t) {
  if (t == DType::kBF16) static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  else if (t == DType::kF16) static_cast<__half*>(out)[i] = __float2half_rn(v);
  else static_cast<float*>(out)[i] = v;
}

// A KV element as float, from a float32 or bf16 pool.
__device__ inline float load_f(const float* p) { return *p; }
__device__ inline float load_f(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// The sum of v over the block's threads, on every thread; `partial` holds one
// float per warp. blockDim.x is a multiple of 32.
__device__ inline float block_sum(float v, float* partial) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warps = static_cast<int>(blockDim.x) / 32;
  __syncthreads();  // `partial` may still be read by an earlier call
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = 0.0f;
  for (int w = 0; w < warps; ++w) v += partial[w];
  return v;
}

}  // namespace tandem::runtime::cuda
