// A long product's input for Hopper's FP8 tensor cores (fp8_gemm.h): each
// row's groups of 128 columns as E4M3 codes and a float32 scale, the rule of
// the CPU's FP8 KV rows (kernels.h quantize_fp8_row): scale = max |x| / 448,
// code = x / scale to nearest even; an all-zero group has scale 0 and zero
// codes; a group holding inf or NaN has scale NaN. cuBLASLt takes rows in
// eights (ops.h fp8_scale_ld): the rows up to the next multiple of 8 get zero
// codes and scale 0.
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

// One warp a group: lane l holds columns l, l + 32, l + 64, l + 96 of it.
__global__ void quantize_groups_kernel(const float* x, int64_t rows, int64_t k, uint8_t* codes, float* scales,
                                       int64_t scale_ld) {
  const int64_t groups = k / kFp8Group;
  const int64_t g = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (g >= scale_ld * groups) return;  // a whole warp leaves together
  const int64_t row = g / groups, col0 = (g % groups) * kFp8Group;
  uint8_t* out = codes + row * k + col0;
  if (row >= rows) {  // padding
    for (int i = 0; i < 4; ++i) out[lane + 32 * i] = 0;
    if (lane == 0) scales[(col0 / kFp8Group) * scale_ld + row] = 0.0f;
    return;
  }
  const float* in = x + row * k + col0;
  float v[4], amax = 0.0f;
  bool finite = true;
  for (int i = 0; i < 4; ++i) {
    v[i] = in[lane + 32 * i];
    finite = finite && isfinite(v[i]);
    amax = fmaxf(amax, fabsf(v[i]));
  }
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  finite = __all_sync(0xffffffffu, finite);
  const float scale = finite ? amax / 448.0f : __int_as_float(0x7fc00000);
  for (int i = 0; i < 4; ++i) out[lane + 32 * i] = scale > 0.0f ? e4m3_code(v[i] / scale) : 0;
  if (lane == 0) scales[(col0 / kFp8Group) * scale_ld + row] = scale;
}

}  // namespace

void quantize_groups_fp8(const float* x, int64_t rows, int64_t k, uint8_t* codes, float* scales, cudaStream_t stream) {
  if (rows == 0 || k < kFp8Group) return;
  const int64_t warps = fp8_scale_ld(rows) * (k / kFp8Group);
  quantize_groups_kernel<<<blocks_for(warps * 32, 256), 256, 0, stream>>>(x, rows, k, codes, scales, fp8_scale_ld(rows));
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
