// Prefill attention in tiles (FlashAttention-2's loop, in float32 on the
// SIMT cores): a block takes kTileQ consecutive rows of one sequence and one
// query head, walks the keys in tiles of kTileK staged in shared memory, and
// keeps an online softmax per row. Each key is read once per tile of rows
// instead of once per row, which is what makes long prompts affordable.
#include <cmath>

#include <string>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

constexpr int kThreads = 128;

// PER: output elements per thread, kTileQ * head_dim / kThreads rounded up.
template <int PER, class T>
__global__ void attention_tiles_kernel(const float* q, int64_t heads, int64_t window, RowTables rt, const int32_t* tiles,
                                       int64_t n_tiles, PoolShape s, int64_t layer, const T* pool, float scale,
                                       float* out) {
  extern __shared__ float smem[];
  const int64_t hd = s.head_dim, width = s.kv_heads * s.row();
  const int64_t tile = blockIdx.x, h = blockIdx.y, g = h / (heads / s.kv_heads);
  const int64_t r0 = tiles[tile], nq = tiles[n_tiles + tile];  // first row, rows (consecutive positions of one sequence)
  // K rows and score rows are padded by one float: the lanes of a warp read
  // K at the same d for different keys (and the softmax threads one score
  // column for different rows), which would otherwise all hit one bank.
  const int64_t ks_stride = hd + 1, ss_stride = kTileK + 1;
  float* qs = smem;                       // [kTileQ][hd]
  float* ks = qs + kTileQ * hd;           // [kTileK][hd + 1]
  float* vs = ks + kTileK * ks_stride;    // [kTileK][hd]
  float* ss = vs + kTileK * hd;           // [kTileQ][kTileK + 1] scores, then probabilities
  float* corr = ss + kTileQ * ss_stride;  // [kTileQ] rescale of the rows' accumulators
  float* row_m = corr + kTileQ;           // [kTileQ] running max
  float* row_l = row_m + kTileQ;          // [kTileQ] running sum
  const int32_t* table = rt.tables + rt.table_of[r0];
  const int64_t p0 = rt.positions[r0], last = p0 + nq - 1;
  auto first_of = [&](int64_t pos) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : int64_t{0}; };

  for (int64_t e = threadIdx.x; e < kTileQ * hd; e += kThreads) {
    const int64_t i = e / hd, d = e % hd;
    qs[e] = i < nq ? q[((r0 + i) * heads + h) * hd + d] : 0.0f;
  }
  if (threadIdx.x < kTileQ) row_m[threadIdx.x] = -INFINITY, row_l[threadIdx.x] = 0.0f;
  float acc[PER];
  for (int k = 0; k < PER; ++k) acc[k] = 0.0f;

  for (int64_t t0 = first_of(p0); t0 <= last; t0 += kTileK) {
    const int64_t nk = last - t0 + 1 < kTileK ? last - t0 + 1 : kTileK;
    __syncthreads();  // the last tile's V and probabilities are no longer read
    for (int64_t e = threadIdx.x; e < kTileK * hd; e += kThreads) {
      const int64_t j = e / hd, d = e % hd;
      if (j < nk) {
        const int64_t t = t0 + j, blk = table[t / s.block_size], slot = t % s.block_size;
        const T* k = pool + ((blk * s.layers + layer) * 2 + 0) * s.block_size * width + (g * s.block_size + slot) * s.row();
        const T* v = k + s.block_size * width;
        ks[j * ks_stride + d] = kv_value(k, d, row_scale(k, hd));
        vs[e] = kv_value(v, d, row_scale(v, hd));
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTileQ * kTileK; e += kThreads) {
      const int64_t i = e / kTileK, j = e % kTileK, t = t0 + j, pos = p0 + i;
      float v = -INFINITY;
      if (i < nq && j < nk && t <= pos && t >= first_of(pos)) {
        float dot = 0.0f;
        for (int64_t d = 0; d < hd; ++d) dot += qs[i * hd + d] * ks[j * ks_stride + d];
        v = dot * scale;
      }
      ss[i * ss_stride + j] = v;
    }
    __syncthreads();
    if (threadIdx.x < kTileQ) {  // one thread per row: the online softmax's bookkeeping
      const int i = threadIdx.x;
      float m = row_m[i];
      for (int j = 0; j < kTileK; ++j) m = fmaxf(m, ss[i * ss_stride + j]);
      if (m == -INFINITY) {  // nothing visible to this row yet
        corr[i] = 1.0f;
        for (int j = 0; j < kTileK; ++j) ss[i * ss_stride + j] = 0.0f;
      } else {
        corr[i] = expf(row_m[i] - m);
        float sum = 0.0f;
        for (int j = 0; j < kTileK; ++j) sum += (ss[i * ss_stride + j] = expf(ss[i * ss_stride + j] - m));
        row_l[i] = row_l[i] * corr[i] + sum;
        row_m[i] = m;
      }
    }
    __syncthreads();
    for (int k = 0; k < PER; ++k) {
      const int64_t e = threadIdx.x + static_cast<int64_t>(k) * kThreads;
      if (e >= kTileQ * hd) break;
      const int64_t i = e / hd, d = e % hd;
      float o = acc[k] * corr[i];
      for (int64_t j = 0; j < nk; ++j) o += ss[i * ss_stride + j] * vs[j * hd + d];
      acc[k] = o;
    }
  }
  __syncthreads();
  for (int k = 0; k < PER; ++k) {
    const int64_t e = threadIdx.x + static_cast<int64_t>(k) * kThreads;
    if (e >= kTileQ * hd) break;
    const int64_t i = e / hd, d = e % hd;
    if (i < nq) out[((r0 + i) * heads + h) * hd + d] = acc[k] / row_l[i];
  }
}

template <int PER, class T>
void launch_tiles(const float* q, int64_t heads, int64_t window, RowTables rt, const int32_t* tiles, int64_t n_tiles,
                  PoolShape shape, int64_t layer, const T* pool, float* out, cudaStream_t stream) {
  const std::size_t bytes = sizeof(float) * static_cast<std::size_t>((kTileQ + 2 * kTileK) * shape.head_dim + kTileK +
                                                                     kTileQ * (kTileK + 1) + 3 * kTileQ);
  // Past the default 48 KiB (head_dim 256), ask for it at every launch: the setting is the current device's, a
  // host call (no stream operation), and a record of it kept here would be shared by every thread and device.
  if (bytes > 48 * 1024)
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(attention_tiles_kernel<PER, T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  attention_tiles_kernel<PER, T><<<grid, kThreads, bytes, stream>>>(q, heads, window, rt, tiles, n_tiles, shape, layer,
                                                                    pool, scale, out);
  TANDEM_CUDA_LAUNCHED();
}

template <class T>
void dispatch_tiles(const float* q, int64_t heads, int64_t window, RowTables rt, const int32_t* tiles, int64_t n_tiles,
                    PoolShape shape, int64_t layer, const T* pool, float* out, cudaStream_t stream) {
  const int64_t per = (kTileQ * shape.head_dim + kThreads - 1) / kThreads;
  if (per <= 4) launch_tiles<4>(q, heads, window, rt, tiles, n_tiles, shape, layer, pool, out, stream);
  else if (per <= 8) launch_tiles<8>(q, heads, window, rt, tiles, n_tiles, shape, layer, pool, out, stream);
  else if (per <= 16) launch_tiles<16>(q, heads, window, rt, tiles, n_tiles, shape, layer, pool, out, stream);
  else launch_tiles<32>(q, heads, window, rt, tiles, n_tiles, shape, layer, pool, out, stream);
}

}  // namespace

void attention_tiles(const float* q, int64_t heads, int64_t sliding_window, RowTables rt, const int32_t* tiles,
                     int64_t n_tiles, PoolShape shape, int64_t layer, const void* pool, float* out, cudaStream_t stream) {
  if (n_tiles == 0) return;
  if (shape.kv == DType::kF8E4M3)
    dispatch_tiles(q, heads, sliding_window, rt, tiles, n_tiles, shape, layer, static_cast<const Fp8Code*>(pool), out,
                   stream);
  else if (shape.kv == DType::kBF16)
    dispatch_tiles(q, heads, sliding_window, rt, tiles, n_tiles, shape, layer, static_cast<const __nv_bfloat16*>(pool),
                   out, stream);
  else if (shape.kv == DType::kF32)
    dispatch_tiles(q, heads, sliding_window, rt, tiles, n_tiles, shape, layer, static_cast<const float*>(pool), out,
                   stream);
  else
    throw Error("internal: a KV pool holds float32, bf16 or FP8, not " + std::string(dtype_name(shape.kv)));
}

}  // namespace tandem::runtime::cuda
