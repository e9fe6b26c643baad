// Products of our own (ops.h products()): a mixture of experts' grouped
// expert products and the router, and every product of an 8-bit checkpoint's
// weights, which stay 8-bit on the device. Float32 arithmetic, each output a
// sum over k in order, fmaf by fmaf, on the weights' values (an 8-bit
// weight's value is its code times its scale, one float32 product, as the
// CPU's): a row's result never depends on the other rows of its step.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

// An INT8 code as its storage (FP8 codes are store.cuh's Fp8Code).
struct I8 {
  int8_t v;
};

__device__ inline float to_f(float v) { return v; }
__device__ inline float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float to_f(__half v) { return __half2float(v); }
__device__ inline float to_f(I8 c) { return static_cast<float>(c.v); }
__device__ inline float to_f(Fp8Code c) { return e4m3_value(c.bits); }

// Weight (n, k) of a [N][K] matrix w (a group's), as a float32 value: an
// 8-bit code times its scale (one float32 product, as the CPU's).
template <class W>
__device__ inline float weight_value(const W* w, const float* scales, const ProductScales& s, int64_t n, int64_t k,
                                     int64_t K) {
  float v = to_f(w[n * K + k]);
  if (scales)  // 32-bit division: k, the offset and the block are far below 2^31
    v *= scales[n * s.ld + static_cast<int32_t>(k + s.offset) / static_cast<int32_t>(s.block_cols)];
  return v;
}

// A tile of kProductTileRows positions of one group by kTileN outputs; 256
// threads, each 2 rows x 4 outputs (columns tx, tx + 16, tx + 32, tx + 48).
constexpr int kTileN = 64, kTileK = 32, kThreads = 256;
static_assert(kProductTileRows == 32, "the tile's thread layout is 16 x 16 threads of 2 rows x 4 outputs");

template <class W>
__global__ void __launch_bounds__(kThreads) product_kernel(Product p, RowGroups g, int64_t count) {
  __shared__ float xs[kTileK][kProductTileRows + 1];
  __shared__ float ws[kTileK][kTileN + 1];
  const auto tile = static_cast<int32_t>(blockIdx.x);
  int64_t j = 0, row0 = 0, row1 = 0;
  if (g.offsets) {
    if (tile >= g.tile_start[count]) return;
    int64_t lo = 0, hi = count - 1;  // the last group whose tiles start at or before this one
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (g.tile_start[mid] <= tile) lo = mid;
      else hi = mid - 1;
    }
    j = lo;
    row0 = g.offsets[j] + static_cast<int64_t>(tile - g.tile_start[j]) * kProductTileRows;
    row1 = min(row0 + kProductTileRows, static_cast<int64_t>(g.offsets[j + 1]));
  } else {
    row0 = static_cast<int64_t>(tile) * kProductTileRows;
    row1 = min(row0 + kProductTileRows, p.rows);
    if (row0 >= row1) return;
  }
  const int64_t K = p.k, N = p.n, n0 = static_cast<int64_t>(blockIdx.y) * kTileN;
  const W* w = static_cast<const W*>(p.w) + j * N * K;
  const float* scales = p.scales.grid ? p.scales.grid + j * N * p.scales.ld : nullptr;  // the group's rows of them
  const int tx = static_cast<int>(threadIdx.x) % 16, ty = static_cast<int>(threadIdx.x) / 16;
  auto in_row = [&](int64_t i) -> int64_t { return p.gather ? g.order[i] / p.top_k : i; };
  const int64_t in_width = p.swiglu ? 2 * K : K;
  float acc[2][4] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kTileK) {
    for (int e = static_cast<int>(threadIdx.x); e < kProductTileRows * kTileK; e += kThreads) {
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
      const int64_t n = n0 + nn, k = k0 + kk;
      ws[kk][nn] = n < N && k < K ? weight_value(w, scales, p.scales, n, k, K) : 0.0f;
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

// Rows [n0, n0 + n) of w, element by element, as bf16 values.
template <class W>
__global__ void dequantize_kernel(const W* w, ProductScales s, int64_t n0, int64_t n, int64_t K, __nv_bfloat16* out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < n * K; e += stride)
    out[e] = __float2bfloat16_rn(weight_value(w, s.grid, s, n0 + e / K, e % K, K));
}

}  // namespace

void dequantize_bf16(const void* codes, DType dtype, const ProductScales& s, int64_t n0, int64_t n, int64_t k, void* out,
                     cudaStream_t stream) {
  if (n == 0 || k == 0) return;
  if (!s.grid) throw Error("internal: dequantize_bf16 takes 8-bit weights with their scales");
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n * k + 255) / 256, 65535));
  auto* o = static_cast<__nv_bfloat16*>(out);
  if (dtype == DType::kF8E4M3) dequantize_kernel<<<blocks, 256, 0, stream>>>(static_cast<const Fp8Code*>(codes), s, n0, n, k, o);
  else if (dtype == DType::kI8) dequantize_kernel<<<blocks, 256, 0, stream>>>(static_cast<const I8*>(codes), s, n0, n, k, o);
  else throw Error("internal: dequantize_bf16 takes FP8 E4M3 or INT8 codes");
  TANDEM_CUDA_LAUNCHED();
}

int64_t product_tiles(int64_t rows, int64_t groups) { return (rows + kProductTileRows - 1) / kProductTileRows + groups; }

void products(const Product& p, const RowGroups& g, int64_t count, int64_t max_tiles, cudaStream_t stream) {
  if (max_tiles <= 0 || p.n == 0) return;
  const dim3 grid(static_cast<unsigned>(max_tiles), static_cast<unsigned>((p.n + kTileN - 1) / kTileN));
  const bool scaled = p.scales.grid != nullptr;
  if (scaled != (p.w_dtype == DType::kF8E4M3 || p.w_dtype == DType::kI8))
    throw Error("internal: an 8-bit product needs its scales, and only an 8-bit one takes them");
  switch (p.w_dtype) {
    case DType::kF32: product_kernel<float><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kBF16: product_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kF16: product_kernel<__half><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kF8E4M3: product_kernel<Fp8Code><<<grid, kThreads, 0, stream>>>(p, g, count); break;
    case DType::kI8: product_kernel<I8><<<grid, kThreads, 0, stream>>>(p, g, count); break;
  }
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
