// Drawing each row's token on the device, as the host's sample_token does for
// rows without penalties, logprobs, top-k or top-p: greedy (the argmax), or
// the temperature's softmax weights exp((logit - max) / T) (under e^-48 of the
// best token's counting as zero), min-p, and the first token in id order
// whose cumulative weight passes u x the total. Only the token comes back
// instead of the row's logits. Sums run over contiguous chunks, one per
// thread, then across threads in a fixed order: deterministic, and equal to
// the host's sequential sums up to rounding.
#include <cstdint>

#include "runtime/cuda/argmax.cuh"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

constexpr int kThreads = kArgmaxThreads;
constexpr int kWarps = kThreads / 32;
constexpr float kNegligible = 48.0f;  // as runtime/engine/sampling.cpp

__device__ inline double weight(float logit, float max, float inv_t, double min_p) {
  const float x = (logit - max) * inv_t;
  const double w = x > -kNegligible ? exp(static_cast<double>(x)) : 0.0;
  return w < min_p ? 0.0 : w;
}

__global__ void draw_kernel(const float* logits, int64_t n, const DrawParams* params, int32_t* out) {
  __shared__ double warp_sums[kWarps];
  __shared__ float warp_max[kWarps];
  __shared__ int32_t picked;
  const float* row = logits + blockIdx.x * n;
  const DrawParams p = params[blockIdx.x];
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (p.temperature <= 1e-5f) {
    const int32_t best = block_argmax(row, n);
    if (threadIdx.x == 0) out[blockIdx.x] = best;
    return;
  }
  // The largest logit (NaNs never compare greater).
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kThreads) m = row[i] > m ? row[i] : m;
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if (lane == 0) warp_max[warp] = m;
  if (threadIdx.x == 0) picked = INT32_MAX;
  __syncthreads();
  m = -INFINITY;
  for (int w = 0; w < kWarps; ++w) m = fmaxf(m, warp_max[w]);
  const float inv_t = 1.0f / p.temperature;
  const double min_p = p.min_p > 0.0f ? static_cast<double>(p.min_p) : 0.0;
  // This thread's chunk of ids and its weight.
  const int64_t chunk = (n + kThreads - 1) / kThreads, begin = threadIdx.x * chunk;
  const int64_t end = begin + chunk < n ? begin + chunk : n;
  double mine = 0;
  for (int64_t i = begin; i < end; ++i) mine += weight(row[i], m, inv_t, min_p);
  // Each chunk's range [lo, hi) of the cumulative weight, in thread order. A
  // chunk's lo is computed exactly as the previous chunk's hi (the same adds of
  // the same values), so the ranges tile [0, total) with no gap or overlap and
  // exactly one chunk holds the target.
  double incl = mine;
  for (int o = 1; o < 32; o <<= 1) {
    const double up = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += up;
  }
  const double prev = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 31) warp_sums[warp] = incl;
  __syncthreads();
  double offset = 0, total = 0;
  for (int w = 0; w < kWarps; ++w) {
    if (w == warp) offset = total;
    total += warp_sums[w];
  }
  const double lo = offset + (lane > 0 ? prev : 0.0), hi = offset + incl;
  const double target = p.u * total;  // < total for u < 1
  if (lo <= target && target < hi) {  // the draw lands in this chunk
    double c = lo;
    int32_t last = -1;
    for (int64_t i = begin; i < end; ++i) {
      const double w = weight(row[i], m, inv_t, min_p);
      if (w == 0) continue;
      c += w;
      last = static_cast<int32_t>(i);
      if (target < c) break;
    }
    atomicMin(&picked, last);  // one thread gets here; rounding past its last weight keeps that last one
  }
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = picked == INT32_MAX ? 0 : picked;  // no weight at all: 0, as the host
}

}  // namespace

void draw(const float* logits, int64_t rows, int64_t n, const DrawParams* params, int32_t* out, cudaStream_t stream) {
  if (rows == 0) return;
  draw_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, n, params, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
