// Writing a float result in the type the next product (or the KV pool)
// takes: float32, or bf16/f16 rounded to nearest even, as the CPU's
// f32_to_bf16 and to_half(); writing and reading FP8 KV rows; block reductions.
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

// FP8 KV (kv/kv_layout.h): a row is head_dim E4M3 codes, then its float32
// scale; a value is code x scale rounded once, as the CPU's widen_fp8_row.
struct Fp8Code {
  uint8_t bits;
};
// As the host's f8e4m3_to_f32 (runtime/model/dtype.cpp): every code, its NaN too.
__device__ inline float e4m3_value(uint8_t b) {
  const int exp = (b >> 3) & 0xF, man = b & 7;
  float v;
  if (exp == 15 && man == 7) v = __int_as_float(0x7fc00000);
  else if (exp == 0) v = ldexpf(static_cast<float>(man), -9);  // subnormal: man/8 * 2^-6
  else v = ldexpf(1.0f + static_cast<float>(man) / 8.0f, exp - 7);
  return (b & 0x80) ? -v : v;
}
// As the host's f32_to_f8e4m3: nearest, ties to even, saturating at 448; NaN to 0x7F.
__device__ inline uint8_t e4m3_code(float f) {
  if (isnan(f)) return 0x7F;
  const uint8_t sign = signbit(f) ? 0x80 : 0x00;
  const float a = fabsf(f);
  if (a >= 448.0f) return sign | 0x7E;
  int e;
  frexpf(a, &e);  // the binade [2^(e-1), 2^e)
  const int step = max(e - 1, -6) - 3;
  const float v = ldexpf(rintf(ldexpf(a, -step)), step);
  if (v >= 448.0f) return sign | 0x7E;
  if (v < 0x1p-6f) return sign | static_cast<uint8_t>(ldexpf(v, 9));  // subnormal (or zero)
  int ve;
  const float vm = frexpf(v, &ve);
  return sign | static_cast<uint8_t>((ve - 1 + 7) << 3) | static_cast<uint8_t>(static_cast<int>(ldexpf(vm, 4)) - 8);
}
// Element d of a KV row (float32, bf16 or FP8) as float, and the row's scale (1 where rows have none).
__device__ inline float row_scale(const float*, int64_t) { return 1.0f; }
__device__ inline float row_scale(const __nv_bfloat16*, int64_t) { return 1.0f; }
__device__ inline float row_scale(const Fp8Code* row, int64_t head_dim) {
  return *reinterpret_cast<const float*>(row + head_dim);
}
__device__ inline float kv_value(const float* row, int64_t d, float) { return row[d]; }
__device__ inline float kv_value(const __nv_bfloat16* row, int64_t d, float) { return __bfloat162float(row[d]); }
__device__ inline float kv_value(const Fp8Code* row, int64_t d, float scale) { return e4m3_value(row[d].bits) * scale; }

// v reduced by op over the block's threads, on every thread; `partial`
// holds one float per warp. blockDim.x is a multiple of 32.
template <class Op>
__device__ inline float block_reduce(float v, float* partial, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warps = static_cast<int>(blockDim.x) / 32;
  __syncthreads();  // `partial` may still be read by an earlier call
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  v = partial[0];
  for (int w = 1; w < warps; ++w) v = op(v, partial[w]);
  return v;
}
struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
// The sum, and the largest, of v over the block's threads, on every thread.
__device__ inline float block_sum(float v, float* partial) { return block_reduce(v, partial, AddOp{}); }
__device__ inline float block_max(float v, float* partial) { return block_reduce(v, partial, MaxOp{}); }

}  // namespace tandem::runtime::cuda
