// Prefill attention on the tensor cores, for bf16/f16 models: the tiled loop
// of attention_prefill.cu (kTileQ rows of one sequence per block, for the
// query heads of one KV head that fit, which share each staged K/V tile; an
// online softmax per row and head), with S = Q K^T and O += P V as bf16
// products accumulated in float32 (WMMA 16x16x16). Q, K and V are rounded to
// bf16 as they are staged; the softmax and O stay in float32. float32 models
// keep the SIMT kernel, which matches the CPU more closely. bf16 WMMA needs
// sm_80 or newer (Ampere), the oldest architecture Tandem builds for.
#include <cuda_bf16.h>
#include <mma.h>

#include <algorithm>
#include <string>

#include "common/error.h"

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

// Shared memory, in this order (every part starts 32-byte aligned, as WMMA's loads want),
// for hpb query heads of one KV head (a GQA group, or part of one), which share each K/V tile:
//   q  bf16 [hpb][16][hd + 8] k  bf16 [64][hd + 8]     v  bf16 [64][hd + 8]
//   s  f32  [16][64 + 8]      p  bf16 [16][64 + 8]     o  f32  [hpb][16][hd + 4]
//   row_m, row_l, corr: f32 [hpb][16] each          key: int64 [64] (each key's K in the pool; -1: none)
// The pads shift each row off the banks of the row before (s: 8 floats, so that
// the softmax's 4 rows x 8 lanes of a warp meet no conflict).
__host__ __device__ constexpr std::size_t up32(std::size_t b) { return (b + 31) / 32 * 32; }

struct Layout {
  int64_t ldh, lds, ldp, ldo;  // leading dimensions in elements
  std::size_t q, k, v, s, p, o, m, key, bytes;
  __host__ __device__ Layout(int64_t hd, int64_t hpb) {
    ldh = hd + 8, lds = kKeys + 8, ldp = kKeys + 8, ldo = hd + 4;
    const auto heads = static_cast<std::size_t>(hpb);
    q = 0;
    k = q + up32(sizeof(bf16) * heads * kTileQ * ldh);
    v = k + up32(sizeof(bf16) * kKeys * ldh);
    s = v + up32(sizeof(bf16) * kKeys * ldh);
    p = s + up32(sizeof(float) * kTileQ * lds);
    o = p + up32(sizeof(bf16) * kTileQ * ldp);
    m = o + up32(sizeof(float) * heads * kTileQ * ldo);
    key = m + up32(sizeof(float) * 3 * heads * kTileQ);
    bytes = key + sizeof(int64_t) * kKeys;
  }
};

// Four consecutive KV elements as two bf16 pairs: rounded from float32, or as they are.
__device__ inline void load4(const float* p, __nv_bfloat162& lo, __nv_bfloat162& hi) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
}
__device__ inline void load4(const bf16* p, __nv_bfloat162& lo, __nv_bfloat162& hi) {
  const uint2 v = *reinterpret_cast<const uint2*>(p);
  lo = *reinterpret_cast<const __nv_bfloat162*>(&v.x), hi = *reinterpret_cast<const __nv_bfloat162*>(&v.y);
}

template <class T>
__global__ void __launch_bounds__(kThreads, 4) attention_tc_kernel(const float* q, int64_t heads, int64_t window, RowTables rt, const int32_t* tiles,
                                    int64_t n_tiles, PoolShape s, int64_t layer, const T* pool, float scale,
                                    float* out, int64_t hpb) {
  extern __shared__ __align__(32) unsigned char smem[];
  const int64_t hd = s.head_dim, width = s.kv_heads * hd;
  const Layout lay(hd, hpb);
  bf16* ks = reinterpret_cast<bf16*>(smem + lay.k);
  bf16* vs = reinterpret_cast<bf16*>(smem + lay.v);
  float* ss = reinterpret_cast<float*>(smem + lay.s);
  bf16* ps = reinterpret_cast<bf16*>(smem + lay.p);
  int64_t* key_at = reinterpret_cast<int64_t*>(smem + lay.key);
  // Query head h0 + hh's own parts.
  auto qs_of = [&](int64_t hh) { return reinterpret_cast<bf16*>(smem + lay.q) + hh * kTileQ * lay.ldh; };
  auto os_of = [&](int64_t hh) { return reinterpret_cast<float*>(smem + lay.o) + hh * kTileQ * lay.ldo; };
  auto stats_of = [&](int64_t hh) { return reinterpret_cast<float*>(smem + lay.m) + hh * 3 * kTileQ; };

  // Block (tile, y): KV head g = y / parts, its query heads h0 .. h0 + hpb.
  const int64_t group = heads / s.kv_heads, parts = group / hpb;
  const int64_t tile = blockIdx.x, g = blockIdx.y / parts, h0 = g * group + (blockIdx.y % parts) * hpb;
  const int64_t r0 = tiles[tile], nq = tiles[n_tiles + tile];
  const int32_t* table = rt.tables + rt.table_of[r0];
  const int64_t p0 = rt.positions[r0], last = p0 + nq - 1;
  auto first_of = [&](int64_t pos) { return window > 0 && pos - window + 1 > 0 ? pos - window + 1 : int64_t{0}; };
  const int warp = static_cast<int>(threadIdx.x) / 32;

  const int hdi = static_cast<int>(hd), hd4 = hdi / 4;  // 32-bit index arithmetic from here on
  for (int64_t hh = 0; hh < hpb; ++hh) {
    bf16* qs = qs_of(hh);
    float* os = os_of(hh);
    for (int e = static_cast<int>(threadIdx.x); e < kTileQ * hdi; e += kThreads) {
      const int i = e / hdi, d = e - i * hdi;
      qs[i * lay.ldh + d] = __float2bfloat16_rn(i < nq ? q[((r0 + i) * heads + h0 + hh) * hd + d] : 0.0f);
      os[i * lay.ldo + d] = 0.0f;
    }
    if (threadIdx.x < kTileQ) stats_of(hh)[threadIdx.x] = -INFINITY, stats_of(hh)[kTileQ + threadIdx.x] = 0.0f;
  }

  for (int64_t t0 = first_of(p0); t0 <= last; t0 += kKeys) {
    const int64_t nk = last - t0 + 1 < kKeys ? last - t0 + 1 : kKeys;
    __syncthreads();  // the last tile's K, V, P and key offsets are no longer read
    if (threadIdx.x < kKeys) {  // where each key of the tile is, once
      const int64_t j = threadIdx.x, t = t0 + j;
      key_at[j] = j < nk ? ((table[t / s.block_size] * s.layers + layer) * 2) * s.block_size * width +
                               (g * s.block_size + t % s.block_size) * hd
                         : -1;
    }
    __syncthreads();
    // Four elements at a time (head_dim % 16 == 0 keeps them aligned), stored as four bf16.
    for (int e = static_cast<int>(threadIdx.x); e < kKeys * hd4; e += kThreads) {
      const int j = e / hd4, c = e - j * hd4;
      auto* kd = reinterpret_cast<__nv_bfloat162*>(ks + j * lay.ldh + 4 * c);
      auto* vd = reinterpret_cast<__nv_bfloat162*>(vs + j * lay.ldh + 4 * c);
      if (key_at[j] >= 0) {
        const T* k = pool + key_at[j] + 4 * c;
        load4(k, kd[0], kd[1]);
        load4(k + s.block_size * width, vd[0], vd[1]);
      } else {  // keys past the tile's end: zeros (their scores are masked)
        kd[0] = kd[1] = vd[0] = vd[1] = __floats2bfloat162_rn(0.0f, 0.0f);
      }
    }
    __syncthreads();
    for (int64_t hh = 0; hh < hpb; ++hh) {  // each query head over the same staged K and V
      const bf16* qs = qs_of(hh);
      float* os = os_of(hh);
      float* row_m = stats_of(hh);
      float* row_l = row_m + kTileQ;
      float* corr = row_l + kTileQ;
      // (No barrier here: this head's S writes ss, which the last head read before two barriers
      // ago, and its P waits for the barrier after S, which every warp reaches past its last PV.)
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
      for (int e = static_cast<int>(threadIdx.x); e < kTileQ * hdi; e += kThreads) {
        const int i = e / hdi;
        os[i * lay.ldo + e - i * hdi] *= corr[i];
      }
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
  }
  __syncthreads();
  for (int64_t hh = 0; hh < hpb; ++hh) {
    const float* os = os_of(hh);
    const float* row_l = stats_of(hh) + kTileQ;
    for (int e = static_cast<int>(threadIdx.x); e < kTileQ * hdi; e += kThreads) {
      const int i = e / hdi, d = e - i * hdi;
      if (i < nq) out[((r0 + i) * heads + h0 + hh) * hd + d] = os[i * lay.ldo + d] / row_l[i];
    }
  }
}

}  // namespace

void attention_tiles_tc(const float* q, int64_t heads, int64_t sliding_window, RowTables rt, const int32_t* tiles,
                        int64_t n_tiles, PoolShape shape, int64_t layer, const void* pool, float* out,
                        cudaStream_t stream) {
  if (n_tiles == 0) return;
  if (shape.head_dim % 16 != 0 || shape.head_dim > 256)
    throw Error("internal: attention_tiles_tc takes head_dim a multiple of 16 up to 256, not " +
                std::to_string(shape.head_dim));
  // Query heads per block: as many of a KV head's group (a divisor of it, at
  // most 8) as one block's shared memory holds while two blocks still fit on
  // an SM, so each K/V tile is staged once for all of them. (One device per
  // process: the limits are read once.)
  struct Limits {
    int block = 48 * 1024, sm = 96 * 1024;
  };
  static const Limits limits = [] {
    Limits l;
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&l.sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device) != cudaSuccess) {
      (void)cudaGetLastError();  // not a launch error: keep the defaults
      l = Limits{};
    }
    return l;
  }();
  const int64_t group = heads / shape.kv_heads;
  int64_t hpb = 1;
  for (int64_t c = std::min<int64_t>(group, 8); c > 1; --c) {
    const std::size_t bytes = Layout(shape.head_dim, c).bytes;
    if (group % c == 0 && bytes <= static_cast<std::size_t>(limits.block) &&
        2 * (bytes + 1024) <= static_cast<std::size_t>(limits.sm)) {
      hpb = c;
      break;
    }
  }
  const Layout lay(shape.head_dim, hpb);
  if (lay.bytes > static_cast<std::size_t>(limits.block))
    throw Error("the tensor-core prefill attention at head_dim " + std::to_string(shape.head_dim) + " needs " +
                std::to_string(lay.bytes) + " bytes of shared memory a block, and this GPU gives " +
                std::to_string(limits.block) +
                " (or did not say its limit): run with TANDEM_CUDA_TC_ATTENTION=0 for the float32 kernel");
  const dim3 grid(static_cast<unsigned>(n_tiles), static_cast<unsigned>(shape.kv_heads * (group / hpb)));
  const float scale = 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  auto run = [&](auto kernel, const auto* kv) {
    // Each kernel may use up to the block limit: set once (thread-safe), it only raises a ceiling.
    static const cudaError_t raised =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, limits.block);
    TANDEM_CUDA_CHECK(raised);
    kernel<<<grid, kThreads, lay.bytes, stream>>>(q, heads, sliding_window, rt, tiles, n_tiles, shape, layer, kv, scale,
                                                  out, hpb);
  };
  if (shape.kv == DType::kBF16) run(attention_tc_kernel<bf16>, static_cast<const bf16*>(pool));
  else if (shape.kv == DType::kF32) run(attention_tc_kernel<float>, static_cast<const float*>(pool));
  else throw Error("internal: the tensor-core attention reads float32 or bf16 KV, not " + std::string(dtype_name(shape.kv)) +
                   " (FP8 KV takes attention_tiles)");
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
