// A mixture of experts' layer on the device (ops.h): routing, grouping by
// expert, the grouped expert products and the combine, with no host wait,
// so a decode step of a MoE model is still one captured graph.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

// One thread a row: the CPU's routing (cpu_model.cpp CpuModel::moe) step for step.
__global__ void moe_route_kernel(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise,
                                 int32_t* expert, float* weight) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (r >= rows) return;
  float* p = logits + r * experts;
  float max = p[0];
  for (int64_t e = 1; e < experts; ++e) max = p[e] > max ? p[e] : max;
  float sum = 0.0f;
  // exp in double rounded to float: within half an ulp, nearer the host libm's expf (~0.5 ulp) than CUDA's expf (2).
  for (int64_t e = 0; e < experts; ++e) sum += (p[e] = static_cast<float>(exp(static_cast<double>(p[e] - max))));
  for (int64_t e = 0; e < experts; ++e) p[e] /= sum;
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
                                                         int64_t first, int64_t count, MoeGroups g,
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
      g.tile_start[j + 1] = g.tile_start[j] + static_cast<int32_t>((m + kMoeTileRows - 1) / kMoeTileRows);
    }
  }
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int64_t e = expert[s];
    if (e >= first && e < first + count) g.order[atomicAdd(&n[e], 1)] = static_cast<int32_t>(s);
  }
}

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f(__half v) { return __half2float(v); }

// A tile of kMoeTileRows positions of one expert by kTileN outputs; 256
// threads, each 2 rows x 4 outputs (columns tx, tx + 16, tx + 32, tx + 48).
// Each output is one float32 sum over k in order, fmaf by fmaf: the same bits
// whichever rows share its tile, expert or step.
constexpr int kTileN = 64, kTileK = 32, kThreads = 256;
static_assert(kMoeTileRows == 32, "the tile's thread layout is 16 x 16 threads of 2 rows x 4 outputs");

template <class W>
__global__ void __launch_bounds__(kThreads) moe_product_kernel(MoeProduct p, MoeGroups g, int64_t count) {
  __shared__ float xs[kTileK][kMoeTileRows + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const auto tile = static_cast<int32_t>(blockIdx.x);
  int64_t j = 0, row0 = 0, row1 = 0;
  if (g.offsets) {
    if (tile >= g.tile_start[count]) return;
    int64_t lo = 0, hi = count - 1;  // the last expert whose tiles start at or before this one
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (g.tile_start[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    j = lo;
    row0 = g.offsets[j] + static_cast<int64_t>(tile - g.tile_start[j]) * kMoeTileRows;
    row1 = min(row0 + kMoeTileRows, static_cast<int64_t>(g.offsets[j + 1]));
  } else {
    row0 = static_cast<int64_t>(tile) * kMoeTileRows;
    row1 = min(row0 + kMoeTileRows, p.rows);
    if (row0 >= row1) return;
  }
  const int64_t K = p.k, N = p.n, n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  const W* w = static_cast<const W*>(p.w) + j * N * K;
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  auto in_row = [&](int64_t i) -> int64_t { return p.gather ? g.order[i] / p.top_k : i; };
  const int64_t in_width = p.swiglu ? 2 * K : K;
  float acc[2][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    for (int e = static_cast<int>(threadIdx.x); e < kMoeTileRows * kTileK; e += kThreads) {
      const int t = e / kTileK, kk = e % kTileK;
      float v = 0.0f;
      if (row0 + t < row1 && k0 + kk < K) {
        const float* x = p.in + in_row(row0 + t) * in_width + k0 + kk;
        if (p.swiglu) {  // as swiglu.cu: silu(gate) * up
          const float gate = x[0], up = x[K];
          v = gate * (1.0f / (1.0f + expf(-gate))) * up;
        } else {
          v = *x;
        }
      }
      xs[kk][t] = v;
    }
    for (int e = static_cast<int>(threadIdx.x); e < kTileN * kTileK; e += kThreads) {
      const int nn = e / kTileK, kk = e % kTileK;
      ws[kk][nn] = n0 + nn < N && k0 + kk < K ? to_f(w[(n0 + nn) * K + k0 + kk]) : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kTileK; ++kk) {
      const float a0 = xs[kk][2 * ty], a1 = xs[kk][2 * ty + 1];
      for (int c = 0; c < 4; ++c) {
        const float b = ws[kk][tx + 16 * c];
        acc[0][c] = fmaf(a0, b, acc[0][c]);
        acc[1][c] = fmaf(a1, b, acc[1][c]);
      }
    }
    __syncthreads();
  }
  for (int r = 0; r < 2; ++r) {
    const int64_t i = row0 + 2 * ty + r;
    if (i >= row1) continue;
    const int64_t out_row = p.scatter ? g.order[i] : i;
    for (int c = 0; c < 4; ++c) {
      const int64_t col = n0 + tx + 16 * c;
      if (col < N) p.out[out_row * N + col] = acc[r][c];
    }
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

void moe_group(const int32_t* expert, int64_t slots, int64_t experts, int64_t first, int64_t count, MoeGroups g,
               unsigned long long* counted, cudaStream_t stream) {
  moe_group_kernel<<<1, 1024, 0, stream>>>(expert, slots, experts, first, count, g, counted);
  TANDEM_CUDA_LAUNCHED();
}

int64_t moe_max_tiles(int64_t slots, int64_t count) { return (slots + kMoeTileRows - 1) / kMoeTileRows + count; }

void moe_products(const MoeProduct& p, const MoeGroups& g, int64_t count, int64_t max_tiles, cudaStream_t stream) {
  if (max_tiles <= 0 || p.n == 0) return;
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>((p.n + kTileN - 1) / kTileN));
  switch (p.w_dtype) {
    case DType::kF32: moe_product_kernel<float><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kBF16: moe_product_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kF16: moe_product_kernel<__half><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    default: throw Error("internal: the expert products take float32, bf16 or f16 weights");
  }
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
