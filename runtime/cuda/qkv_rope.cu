// Everything between the q/k/v product and attention, in one kernel: the
// product's row [q heads | k heads | v heads] gets its bias, each q and k head
// its RMSNorm (Qwen3) and rotary embedding (rotate-half), q goes to the
// attention input and k, v to the row's slot in the paged pool (float32 or
// bf16, rounded to nearest even; or FP8 rows with their scales).
#include <string>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

// An FP8 KV row from the block's values (thread i < half holds elements i
// and i + half), as the CPU's quantize_fp8_row: scale = max|x| / 448 (NaN
// when a value is not finite), code i = E4M3 nearest x[i] / scale (0 for a
// scale of 0 or NaN), the scale after the codes. Every thread of the block calls it.
__device__ void store_fp8_row(uint8_t* row, float a, float b, bool active, int64_t i, int64_t half, int64_t hd,
                              float* partial) {
  const float amax = block_max(active ? fmaxf(fabsf(a), fabsf(b)) : 0.0f, partial);
  const float bad = block_sum(active && !(isfinite(a) && isfinite(b)) ? 1.0f : 0.0f, partial);
  const float scale = bad > 0.0f ? __int_as_float(0x7fc00000) : amax / 448.0f;
  if (active) {
    row[i] = scale > 0.0f ? e4m3_code(a / scale) : 0;
    row[i + half] = scale > 0.0f ? e4m3_code(b / scale) : 0;
  }
  if (threadIdx.x == 0) *reinterpret_cast<float*>(row + hd) = scale;
}

// Block (row, head slot): slots [0, heads) are q heads, then kv_heads k heads,
// then kv_heads v heads. Thread i < head_dim / 2 owns the pair (i, i + half).
__global__ void qkv_rope_kernel(const float* qkv, int64_t heads, const float* bias, const float* q_norm,
                                const float* k_norm, float eps, const float* inv_freq, RowTables rt, PoolShape s,
                                int64_t layer, void* pool, float* q_out) {
  __shared__ float partial[8];
  const int64_t r = blockIdx.x, slot = blockIdx.y, hd = s.head_dim, half = hd / 2, kvh = s.kv_heads;
  const int64_t width = (heads + 2 * kvh) * hd, i = threadIdx.x;
  const bool active = i < half, is_q = slot < heads, is_v = slot >= heads + kvh;
  float a = 0.0f, b = 0.0f;
  if (active) {
    a = qkv[r * width + slot * hd + i];
    b = qkv[r * width + slot * hd + i + half];
    if (bias) a += bias[slot * hd + i], b += bias[slot * hd + i + half];
  }
  const int64_t pos = rt.positions[r];
  const int64_t blk = rt.tables[rt.table_of[r] + pos / s.block_size], in_block = pos % s.block_size;
  // Element offset(block, layer, kv, head, slot), as kv::KvLayout::offset; the pool holds s.kv elements.
  auto pool_at = [&](int64_t kv, int64_t g) {
    return (((blk * s.layers + layer) * 2 + kv) * kvh + g) * s.block_size * s.row() + in_block * s.row();
  };
  const bool fp8 = s.kv == DType::kF8E4M3;
  if (is_v) {  // the whole block takes this branch
    const int64_t v = pool_at(1, slot - heads - kvh);
    if (fp8) store_fp8_row(static_cast<uint8_t*>(pool) + v, a, b, active, i, half, hd, partial);
    else if (active) store_as(pool, v + i, a, s.kv), store_as(pool, v + i + half, b, s.kv);
    return;
  }
  const float* norm = is_q ? q_norm : k_norm;
  if (norm) {  // the block sums together, so every thread takes part
    const float ss = block_sum(a * a + b * b, partial);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
    if (active) a = norm[i] * (a * inv), b = norm[i + half] * (b * inv);
  }
  float ra = 0.0f, rb = 0.0f;
  if (active) {
    const float angle = static_cast<float>(pos) * inv_freq[i];  // as the CPU: float angle, double cos/sin
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float sn = static_cast<float>(sin(static_cast<double>(angle)));
    ra = a * c - b * sn, rb = b * c + a * sn;
  }
  if (is_q) {
    if (active) {
      float* dst = q_out + (r * heads + slot) * hd;
      dst[i] = ra;
      dst[i + half] = rb;
    }
    return;
  }
  const int64_t k = pool_at(0, slot - heads);
  if (fp8) store_fp8_row(static_cast<uint8_t*>(pool) + k, ra, rb, active, i, half, hd, partial);  // the block together
  else if (active) store_as(pool, k + i, ra, s.kv), store_as(pool, k + i + half, rb, s.kv);
}

}  // namespace

void qkv_rope(const float* qkv, int64_t rows, int64_t heads, const float* bias, const float* q_norm, const float* k_norm,
              float eps, const float* inv_freq, RowTables rt, PoolShape shape, int64_t layer, void* pool, float* q_out,
              cudaStream_t stream) {
  if (rows == 0) return;
  if (shape.kv != DType::kF32 && shape.kv != DType::kBF16 && shape.kv != DType::kF8E4M3)
    throw Error("internal: a KV pool holds float32, bf16 or FP8, not " + std::string(dtype_name(shape.kv)));
  const int threads = static_cast<int>((shape.head_dim / 2 + 31) / 32 * 32);  // head_dim <= 512: at most 8 warps
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads + 2 * shape.kv_heads));
  qkv_rope_kernel<<<grid, threads, 0, stream>>>(qkv, heads, bias, q_norm, k_norm, eps, inv_freq, rt, shape, layer, pool,
                                                q_out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
