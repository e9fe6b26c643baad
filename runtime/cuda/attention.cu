#include <cfloat>

#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

constexpr int kWarps = 4;

// One block per (row, query head); its warps take every kWarps-th position,
// lanes split head_dim (PER elements each), and each warp keeps an online
// softmax (running max m, sum l, accumulator) that the block merges at the end.
template <int PER>
__global__ void attention_kernel(const float* q, int64_t heads, int64_t window, RowTables rt, PoolShape s, int64_t layer,
                                 const float* pool, float scale, float* out, const int32_t* only_rows) {
  const int64_t r = only_rows ? only_rows[blockIdx.x] : blockIdx.x, h = blockIdx.y, hd = s.head_dim, width = s.kv_heads * hd;
  const int64_t g = h / (heads / s.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pos = rt.positions[r];
  const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : int64_t{0};
  const int32_t* table = rt.tables + rt.table_of[r];

  float qv[PER], acc[PER];
  for (int i = 0; i < PER; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = d < hd ? q[(r * heads + h) * hd + d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  for (int64_t t = first + warp; t <= pos; t += kWarps) {
    const int64_t blk = table[t / s.block_size], slot = t % s.block_size;
    const float* k = pool + ((blk * s.layers + layer) * 2 + 0) * s.block_size * width + slot * width + g * hd;
    const float* v = k + s.block_size * width;  // the V half of the same block and layer
    float dot = 0.0f;
    for (int i = 0; i < PER; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < hd) dot += qv[i] * k[d];
    }
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    const float score = dot * scale;
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), p = expf(score - m_new);
    l = l * corr + p;
    for (int i = 0; i < PER; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < hd ? p * v[d] : 0.0f);
    }
    m = m_new;
  }
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][PER * 32];
  if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
  for (int i = 0; i < PER; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;
  float M = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w)
    if (sm_l[w] > 0) M = fmaxf(M, sm_m[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sm_l[w] > 0) L += sm_l[w] * expf(sm_m[w] - M);
  for (int i = 0; i < PER; ++i) {
    const int64_t d = lane + 32 * i;
    if (d >= hd) continue;
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sm_l[w] > 0) o += sm_acc[w][lane + 32 * i] * expf(sm_m[w] - M);
    out[(r * heads + h) * hd + d] = o / L;
  }
}

}  // namespace

void attention(const float* q, int64_t rows, int64_t heads, int64_t sliding_window, RowTables rt, PoolShape shape,
               int64_t layer, const float* pool, float* out, cudaStream_t stream, const int32_t* only_rows) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  const int threads = 32 * kWarps;
  if (shape.head_dim <= 32)
    attention_kernel<1><<<grid, threads, 0, stream>>>(q, heads, sliding_window, rt, shape, layer, pool, scale, out, only_rows);
  else if (shape.head_dim <= 64)
    attention_kernel<2><<<grid, threads, 0, stream>>>(q, heads, sliding_window, rt, shape, layer, pool, scale, out, only_rows);
  else if (shape.head_dim <= 128)
    attention_kernel<4><<<grid, threads, 0, stream>>>(q, heads, sliding_window, rt, shape, layer, pool, scale, out, only_rows);
  else
    attention_kernel<8><<<grid, threads, 0, stream>>>(q, heads, sliding_window, rt, shape, layer, pool, scale, out, only_rows);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
