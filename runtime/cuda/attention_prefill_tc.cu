// Prefill attention on the tensor cores, for bf16/f16 models: the tiled loop
// of attention_prefill.cu (kTileQ rows of one sequence and one query head per
// block, an online softmax per row), with S = Q K^T and O += P V as bf16
// products accumulated in float32 (WMMA 16x16x16). Q, K and V are rounded to
// bf16 as they are staged; the softmax and O stay in float32. float32 models
// keep the SIMT kernel, which matches the CPU more closely.
#include <cuda_bf16.h>
#include <mma.h>

#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

using namespace nvcuda;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4, kThreads = kWarps * 32;
constexpr int kKeys = 64;             // keys per tile: one 16-column slice of S per warp
constexpr int kRowThreads = kThreads / kTileQ;  // threads sharing a row in the softmax (8, in one warp)
static_assert(kTileQ == 16, "one WMMA tile of rows");
static_assert(kKeys == 16 * kWarps, "each warp computes 16 columns of S");

// Shared memory, in this order (every part starts 32-byte aligned, as WMMA's loads want):
//   q  bf16 [16][hd + 8]      k  bf16 [64][hd + 8]     v  bf16 [64][hd + 8]
//   s  f32  [16][64 + 4]      p  bf16 [16][64 + 8]     o  f32  [16][hd + 4]
//   row_m, row_l, corr: f32 [16] each
// The pads (8 bf16, 4 floats) shift each row by 16 bytes, off the banks of the row before.
__host__ __device__ constexpr std::size_t up32(std::size_t b) { return (b + 31) / 32 * 32; }

struct Layout {
  int64_t ldh, lds, ldp, ldo;  // leading dimensions in elements
  std::size_t q, k, v, s, p, o, m, bytes;
  __host__ __device__ explicit Layout(int64_t hd) {
    ldh = hd + 8, lds = kKeys + 4, ldp = kKeys + 8, ldo = hd + 4;
    q = 0;
    k = q + up32(sizeof(bf16) * kTileQ * ldh);
    v = k + up32(sizeof(bf16) * kKeys * ldh);
    s = v + up32(sizeof(bf16) * kKeys * ldh);
    p = s + up32(sizeof(float) * kTileQ * lds);
    o = p + up32(sizeof(bf16) * kTileQ * ldp);
    m = o + up32(sizeof(float) * kTileQ * ldo);
    bytes = m + sizeof(float) * 3 * kTileQ;
  }
};

__global__ void attention_tc_kernel(const float* q, int64_t heads, int64_t window, RowTables rt, const int32_t* tiles,
                                    int64_t n_tiles, PoolShape s, int64_t layer, const float* pool, float scale,
                                    float* out) {
  extern __shared__ __align__(32) unsigned char smem[];
  const int64_t hd = s.head_dim, width = s.kv_heads * hd;
  const Layout lay(hd);
  bf16* qs = reinterpret_cast<bf16*>(smem + lay.q);
  bf16* ks = reinterpret_cast<bf16*>(smem + lay.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + lay.v);
  float* ss = reinterpret_cast<float*>(smem + lay.s);
  bf16* ps = reinterpret_cast<bf16*>(smem + lay.p);
  float* os = reinterpret_cast<float*>(smem + lay.o);
  float* row_m = reinterpret_cast<float*>(smem + lay.m);
  float* row_l = row_m + kTileQ;
  float* corr = row_l + kTileQ;

  const int64_t tile = blockIdx.x, h = blockIdx.y, g = h / (heads / s.kv_heads);
  const int64_t r0 = tiles[tile], nq = tiles[n_tiles + tile];
  const int32_t* table = rt.tables + rt.table_of[r0];
  const int64_t p0 = rt.positions[r0], last = p0 + nq - 1;
  auto first_of = [&](int64_t pos) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : int64_t{0}; };
  const int warp = static_cast<int>(threadIdx.x) / 32;

  for (int64_t e = threadIdx.x; e < kTileQ * hd; e += kThreads) {
    const int64_t i = e / hd, d = e % hd;
    qs[i * lay.ldh + d] = __float2bfloat16_rn(i < nq ? q[((r0 + i) * heads + h) * hd + d] : 0.0f);
    os[i * lay.ldo + d] = 0.0f;
  }
  if (threadIdx.x < kTileQ) row_m[threadIdx.x] = -INFINITY, row_l[threadIdx.x] = 0.0f;

  for (int64_t t0 = first_of(p0); t0 <= last; t0 += kKeys) {
    const int64_t nk = last - t0 + 1 < kKeys ? last - t0 + 1 : kKeys;
    __syncthreads();  // the last tile's K, V and P are no longer read
    for (int64_t e = threadIdx.x; e < kKeys * hd; e += kThreads) {
      const int64_t j = e / hd, d = e % hd;
      float kv = 0.0f, vv = 0.0f;  // keys past the tile's end: zeros (their scores are masked)
      if (j < nk) {
        const int64_t t = t0 + j, blk = table[t / s.block_size], slot = t % s.block_size;
        const float* k = pool + ((blk * s.layers + layer) * 2 + 0) * s.block_size * width + slot * width + g * hd;
        kv = k[d];
        vv = k[s.block_size * width + d];
      }
      ks[j * lay.ldh + d] = __float2bfloat16_rn(kv);
      vs[j * lay.ldh + d] = __float2bfloat16_rn(vv);
    }
    __syncthreads();
    {  // S[:, 16w .. 16w + 16) = Q K^T: K rows are B's columns (col_major B over K's row-major storage)
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int64_t d0 = 0; d0 < hd; d0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
        wmma::load_matrix_sync(a, qs + d0, static_cast<unsigned>(lay.ldh));
        wmma::load_matrix_sync(b, ks + static_cast<int64_t>(warp) * 16 * lay.ldh + d0, static_cast<unsigned>(lay.ldh));
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(ss + warp * 16, acc, static_cast<unsigned>(lay.lds), wmma::mem_row_major);
    }
    __syncthreads();
    {  // The online softmax: kRowThreads lanes of one warp per row, kKeys / kRowThreads columns each.
      const int i = static_cast<int>(threadIdx.x) / kRowThreads, part = static_cast<int>(threadIdx.x) % kRowThreads;
      const int64_t pos = p0 + i;
      float v[kKeys / kRowThreads];
      float m = -INFINITY;
      for (int c = 0; c < kKeys / kRowThreads; ++c) {
        const int j = part + c * kRowThreads;
        const int64_t t = t0 + j;
        const bool seen = i < nq && j < nk && t <= pos && t >= first_of(pos);
        v[c] = seen ? ss[i * lay.lds + j] * scale : -INFINITY;
        m = fmaxf(m, v[c]);
      }
      for (int o = kRowThreads / 2; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
      m = fmaxf(m, row_m[i]);
      float sum = 0.0f;
      for (int c = 0; c < kKeys / kRowThreads; ++c) {
        const float pr = m == -INFINITY ? 0.0f : expf(v[c] - m);  // nothing visible to this row yet: all zero
        ps[i * lay.ldp + part + c * kRowThreads] = __float2bfloat16_rn(pr);
        sum += pr;
      }
      for (int o = kRowThreads / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      __syncwarp();  // every lane of the row has read row_m before it changes
      if (part == 0) {
        const float c = m == -INFINITY ? 1.0f : expf(row_m[i] - m);
        corr[i] = c;
        row_l[i] = row_l[i] * c + sum;
        row_m[i] = m;
      }
    }
    __syncthreads();
    for (int64_t e = threadIdx.x; e < kTileQ * hd; e += kThreads) os[(e / hd) * lay.ldo + e % hd] *= corr[e / hd];
    __syncthreads();
    // O[:, n0 .. n0 + 16) += P V for this warp's column slices of O.
    for (int64_t n0 = static_cast<int64_t>(warp) * 16; n0 < hd; n0 += 16 * kWarps) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::load_matrix_sync(acc, os + n0, static_cast<unsigned>(lay.ldo), wmma::mem_row_major);
      for (int j0 = 0; j0 < kKeys; j0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + j0, static_cast<unsigned>(lay.ldp));
        wmma::load_matrix_sync(b, vs + static_cast<int64_t>(j0) * lay.ldh + n0, static_cast<unsigned>(lay.ldh));
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(os + n0, acc, static_cast<unsigned>(lay.ldo), wmma::mem_row_major);
    }
  }
  __syncthreads();
  for (int64_t e = threadIdx.x; e < kTileQ * hd; e += kThreads) {
    const int64_t i = e / hd, d = e % hd;
    if (i < nq) out[((r0 + i) * heads + h) * hd + d] = os[i * lay.ldo + d] / row_l[i];
  }
}

}  // namespace

void attention_tiles_tc(const float* q, int64_t heads, int64_t sliding_window, RowTables rt, const int32_t* tiles,
                        int64_t n_tiles, PoolShape shape, int64_t layer, const float* pool, float* out,
                        cudaStream_t stream) {
  if (n_tiles == 0) return;
  const Layout lay(shape.head_dim);
  static std::size_t granted = 48 * 1024;  // the default; past it (head_dim 128 and up), ask once per size
  if (lay.bytes > granted) {
    TANDEM_CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(lay.bytes)));
    granted = lay.bytes;
  }
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(heads));
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  attention_tc_kernel<<<grid, kThreads, lay.bytes, stream>>>(q, heads, sliding_window, rt, tiles, n_tiles, shape, layer,
                                                             pool, scale, out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
