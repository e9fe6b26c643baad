// A mixture of experts' layer on the device (ops.h): routing, grouping by
// expert and the combine (the expert products are products.cu's), with no
// host wait, so a decode step of a MoE model is still one captured graph.
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

// The CPU's exp_fixed (cpu/kernels.h) step for step: every product, sum and
// fma rounded once to float32 by the _rn intrinsics, which nvcc never fuses
// or reorders; rintf is the CPU's nearbyint (nearest even); ldexpf rounds a
// subnormal result once, as the CPU's ldexp does.
__device__ float exp_fixed(float d) {
  if (isnan(d)) return d;
  const float x = -104.0f > d ? -104.0f : d;
  const float n = rintf(__fmul_rn(x, 1.44269504088896341f));
  float r = __fmaf_rn(-n, 0.693359375f, x);
  r = __fmaf_rn(-n, -2.12194440e-4f, r);
  float p = __fmaf_rn(1.9875691500e-4f, r, 1.3981999507e-3f);
  p = __fmaf_rn(p, r, 8.3334519073e-3f);
  p = __fmaf_rn(p, r, 4.1665795894e-2f);
  p = __fmaf_rn(p, r, 1.6666665459e-1f);
  p = __fmaf_rn(p, r, 5.0000001201e-1f);
  const float y = __fadd_rn(__fmaf_rn(p, __fmul_rn(r, r), r), 1.0f);
  return ldexpf(y, static_cast<int>(n));
}

// One thread a row: the CPU's routing (cpu/expert_parallel.h route_rows) step for step.
__global__ void moe_route_kernel(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise,
                                 int32_t* expert, float* weight) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* p = logits + r * experts;
  float max = p[0];
  for (int64_t e = 1; e < experts; ++e) max = p[e] > max ? p[e] : max;
  float sum = 0.0f;
  for (int64_t e = 0; e < experts; ++e) sum = __fadd_rn(sum, p[e] = exp_fixed(__fsub_rn(p[e], max)));
  for (int64_t e = 0; e < experts; ++e) p[e] = __fdiv_rn(p[e], sum);
  int32_t* ex = expert + r * top_k;
  float* wt = weight + r * top_k;
  float chosen = 0.0f;
  for (int64_t k = 0; k < top_k; ++k) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e) {
      bool taken = false;
      for (int64_t j = 0; j < k; ++j) taken = taken || ex[j] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = e;
    }
    ex[k] = static_cast<int32_t>(best);
    wt[k] = p[best];
    chosen += p[best];
  }
  if (renormalise)
    for (int64_t k = 0; k < top_k; ++k) wt[k] /= chosen;
}

// One block. Counts each expert's slots, lays out the local experts' ranges
// and tiles, then places each local slot at its expert's cursor. The order
// of slots within an expert is the threads' (not slot order): each product
// row depends only on its own input row and is written back to its slot, so
// the order changes no result.
__global__ void __launch_bounds__(1024) moe_group_kernel(const int32_t* expert, int64_t slots, int64_t experts,
                                                         int64_t first, int64_t count, RowGroups g,
                                                         unsigned long long* counted) {
  __shared__ int32_t n[kMaxExperts];
  for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) n[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&n[expert[s]], 1);
  __syncthreads();
  if (counted)
    for (int64_t e = threadIdx.x; e < experts; e += blockDim.x) counted[e] += static_cast<unsigned long long>(n[e]);
  __syncthreads();  // n becomes the local experts' cursors
  if (threadIdx.x == 0) {
    g.offsets[0] = 0;
    g.tile_start[0] = 0;
    for (int64_t j = 0; j < count; ++j) {
      const int32_t m = n[first + j];
      n[first + j] = g.offsets[j];
      g.offsets[j + 1] = g.offsets[j] + m;
      g.tile_start[j + 1] = g.tile_start[j] + static_cast<int32_t>((m + kProductTileRows - 1) / kProductTileRows);
    }
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int64_t e = expert[s];
    if (e >= first && e < first + count) g.order[atomicAdd(&n[e], 1)] = static_cast<int32_t>(s);
  }
}

__global__ void moe_combine_kernel(const float* parts, int64_t part_stride, int64_t experts_per_rank,
                                   const int32_t* expert, const float* weight, int64_t top_k, int64_t hidden,
                                   float* out) {
  const int64_t r = blockIdx.x;
  for (int64_t h = threadIdx.x; h < hidden; h += blockDim.x) {
    float acc = 0.0f;
    for (int64_t k = 0; k < top_k; ++k) {
      const int64_t s = r * top_k + k;
      const int64_t owner = expert[s] / experts_per_rank;
      acc = fmaf(weight[s], parts[owner * part_stride + s * hidden + h], acc);
    }
    out[r * hidden + h] = acc;
  }
}

}  // namespace

void moe_route(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise, int32_t* expert,
               float* weight, cudaStream_t stream) {
  if (rows == 0) return;
  moe_route_kernel<<<blocks_for(rows, 128), 128, 0, stream>>>(logits, rows, experts, top_k, renormalise, expert, weight);
  TANDEM_CUDA_LAUNCHED();
}

void moe_group(const int32_t* expert, int64_t slots, int64_t experts, int64_t first, int64_t count, RowGroups g,
               unsigned long long* counted, cudaStream_t stream) {
  moe_group_kernel<<<1, 1024, 0, stream>>>(expert, slots, experts, first, count, g, counted);
  TANDEM_CUDA_LAUNCHED();
}

void moe_combine(const float* parts, int64_t part_stride, int64_t experts_per_rank, const int32_t* expert,
                 const float* weight, int64_t rows, int64_t top_k, int64_t hidden, float* out, cudaStream_t stream) {
  if (rows == 0) return;
  moe_combine_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(parts, part_stride, experts_per_rank, expert,
                                                                        weight, top_k, hidden, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
