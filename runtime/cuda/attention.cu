// Decode attention (one query row of a sequence against its paged keys),
// split over positions as flash-decoding does: a row's positions are cut into
// `splits` ranges, one block each, so a few sequences still fill the GPU. A
// warp walks one position at a time, and a block of a few warps over a whole
// long context would leave all but a handful of SMs idle and wait on one
// load after another.
#include <algorithm>
#include <cfloat>
#include <type_traits>

#include <string>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

constexpr int kWarps = 4;

// Block (row, query head, split). Its warps take every kWarps-th position of
// the split's range, lanes split head_dim (PER elements each), and each warp
// keeps an online softmax (running max m, sum l, accumulator) that the block
// merges. With one split that is the answer; with several, warp 0 writes the
// block's (acc, m, l) to scratch, and the block that finishes last for its
// (row, head) merges them all and resets the counter for the next launch.
template <int PER, class T>
__global__ void attention_kernel(const float* q, int64_t heads, int64_t window, RowTables rt, PoolShape s, int64_t layer,
                                 const T* pool, float scale, float* out, const int32_t* only_rows,
                                 AttentionScratch scratch) {
  const int64_t index = blockIdx.x, r = only_rows ? only_rows[index] : index, h = blockIdx.y;
  const int64_t split = blockIdx.z, splits = gridDim.z, hd = s.head_dim, width = s.kv_heads * s.row();
  const int64_t g = h / (heads / s.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t pos = rt.positions[r];
  const int64_t first = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : int64_t{0};
  const int64_t per_split = (pos - first + 1 + splits - 1) / splits;
  const int64_t begin = first + split * per_split, end = begin + per_split < pos + 1 ? begin + per_split : pos + 1;
  const int32_t* table = rt.tables + rt.table_of[r];

  float qv[PER], acc[PER];
  for (int i = 0; i < PER; ++i) {
    const int64_t d = lane + 32 * i;
    qv[i] = d < hd ? q[(r * heads + h) * hd + d] : 0.0f;
    acc[i] = 0.0f;
  }
  float m = -FLT_MAX, l = 0.0f;
  auto key_at = [&](int64_t t) {
    const int64_t blk = table[t / s.block_size], slot = t % s.block_size;
    return pool + ((blk * s.layers + layer) * 2 + 0) * s.block_size * width + (g * s.block_size + slot) * s.row();
  };
  // Two positions per step (t and t + kWarps): their loads are in flight together.
  for (int64_t t = begin + warp; t < end; t += 2 * kWarps) {
    const bool two = t + kWarps < end;
    const T* k1 = key_at(t);
    const T* k2 = two ? key_at(t + kWarps) : k1;
    const T* v1 = k1 + s.block_size * width;  // the V half of the same block and layer
    const T* v2 = k2 + s.block_size * width;
    const float ks1 = row_scale(k1, hd), ks2 = row_scale(k2, hd), vs1 = row_scale(v1, hd), vs2 = row_scale(v2, hd);
    float dot1 = 0.0f, dot2 = 0.0f;
    for (int i = 0; i < PER; ++i) {
      const int64_t d = lane + 32 * i;
      if (d < hd) dot1 += qv[i] * kv_value(k1, d, ks1), dot2 += qv[i] * kv_value(k2, d, ks2);
    }
    for (int o = 16; o > 0; o >>= 1) {
      dot1 += __shfl_xor_sync(0xffffffffu, dot1, o);
      dot2 += __shfl_xor_sync(0xffffffffu, dot2, o);
    }
    const float s1 = dot1 * scale, s2 = dot2 * scale;
    const float m_new = two ? fmaxf(m, fmaxf(s1, s2)) : fmaxf(m, s1);
    const float corr = expf(m - m_new), p1 = expf(s1 - m_new), p2 = two ? expf(s2 - m_new) : 0.0f;
    l = l * corr + p1 + p2;
    for (int i = 0; i < PER; ++i) {
      const int64_t d = lane + 32 * i;
      acc[i] = acc[i] * corr + (d < hd ? p1 * kv_value(v1, d, vs1) + p2 * kv_value(v2, d, vs2) : 0.0f);
    }
    m = m_new;
  }
  __shared__ float sm_m[kWarps], sm_l[kWarps];
  __shared__ float sm_acc[kWarps][PER * 32];
  if (lane == 0) sm_m[warp] = m, sm_l[warp] = l;
  for (int i = 0; i < PER; ++i) sm_acc[warp][lane + 32 * i] = acc[i];
  __syncthreads();
  if (warp != 0) return;  // from here on, warp 0 alone: no more block barriers
  float M = -FLT_MAX;
  for (int w = 0; w < kWarps; ++w)
    if (sm_l[w] > 0) M = fmaxf(M, sm_m[w]);
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w)
    if (sm_l[w] > 0) L += sm_l[w] * expf(sm_m[w] - M);
  float o[PER];
  for (int i = 0; i < PER; ++i) {
    o[i] = 0.0f;
    for (int w = 0; w < kWarps; ++w)
      if (sm_l[w] > 0) o[i] += sm_acc[w][lane + 32 * i] * expf(sm_m[w] - M);
  }
  if (splits == 1) {
    for (int i = 0; i < PER; ++i)
      if (lane + 32 * i < hd) out[(r * heads + h) * hd + lane + 32 * i] = o[i] / L;
    return;
  }
  // Several splits: this block's part, [hd accumulators][m][l] (l = 0: no positions in its range).
  const int64_t stride = hd + 2, pair = index * heads + h;
  float* mine = scratch.partial + (pair * splits + split) * stride;
  for (int i = 0; i < PER; ++i)
    if (lane + 32 * i < hd) mine[lane + 32 * i] = o[i];
  if (lane == 0) mine[hd] = M, mine[hd + 1] = L;
  __threadfence();  // our part is visible to every block before we are counted
  __syncwarp();
  int last = 0;
  if (lane == 0) last = atomicAdd(scratch.counters + pair, 1) == static_cast<int>(splits) - 1;
  last = __shfl_sync(0xffffffffu, last, 0);
  if (!last) return;
  __threadfence();  // the other blocks' parts, counted before us, are visible to us
  const float* parts = scratch.partial + pair * splits * stride;
  M = -FLT_MAX;
  for (int64_t k = 0; k < splits; ++k)
    if (__ldcg(parts + k * stride + hd + 1) > 0) M = fmaxf(M, __ldcg(parts + k * stride + hd));
  L = 0.0f;
  for (int i = 0; i < PER; ++i) o[i] = 0.0f;
  for (int64_t k = 0; k < splits; ++k) {
    const float lk = __ldcg(parts + k * stride + hd + 1);
    if (lk <= 0) continue;
    const float f = expf(__ldcg(parts + k * stride + hd) - M);
    L += lk * f;
    for (int i = 0; i < PER; ++i)
      if (lane + 32 * i < hd) o[i] += __ldcg(parts + k * stride + lane + 32 * i) * f;
  }
  for (int i = 0; i < PER; ++i)
    if (lane + 32 * i < hd) out[(r * heads + h) * hd + lane + 32 * i] = o[i] / L;
  if (lane == 0) scratch.counters[pair] = 0;  // ready for the next launch (the stream orders it)
}

}  // namespace

int64_t attention_splits(int64_t rows, int64_t heads, int sms) {
  const int64_t blocks = rows * heads, want = 4 * static_cast<int64_t>(sms);
  if (blocks <= 0 || blocks >= want) return 1;
  return std::min<int64_t>(kMaxAttentionSplits, (want + blocks - 1) / blocks);
}

void attention(const float* q, int64_t rows, int64_t heads, int64_t sliding_window, RowTables rt, PoolShape shape,
               int64_t layer, const void* pool, float* out, cudaStream_t stream, const int32_t* only_rows,
               AttentionScratch scratch) {
  if (rows == 0) return;
  const auto splits = static_cast<unsigned>(scratch.partial && scratch.counters && scratch.splits > 1 ? scratch.splits : 1);
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads), splits);
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  const int threads = 32 * kWarps;
  auto run = [&](auto per, const auto* kv) {
    attention_kernel<decltype(per)::value><<<grid, threads, 0, stream>>>(q, heads, sliding_window, rt, shape, layer, kv,
                                                                          scale, out, only_rows, scratch);
  };
  auto with = [&](const auto* kv) {
    if (shape.head_dim <= 32) run(std::integral_constant<int, 1>{}, kv);
    else if (shape.head_dim <= 64) run(std::integral_constant<int, 2>{}, kv);
    else if (shape.head_dim <= 128) run(std::integral_constant<int, 4>{}, kv);
    else run(std::integral_constant<int, 8>{}, kv);
  };
  if (shape.kv == DType::kBF16) with(static_cast<const __nv_bfloat16*>(pool));
  else if (shape.kv == DType::kF32) with(static_cast<const float*>(pool));
  else if (shape.kv == DType::kF8E4M3) with(static_cast<const Fp8Code*>(pool));
  else throw Error("internal: a KV pool holds float32, bf16 or FP8, not " + std::string(dtype_name(shape.kv)));
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
