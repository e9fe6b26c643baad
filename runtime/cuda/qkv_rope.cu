// Everything between the q/k/v product and attention, in one kernel: the
// product's row [q heads | k heads | v heads] gets its bias, each q and k head
// its RMSNorm (Qwen3) and rotary embedding (rotate-half), q goes to the
// attention input and k, v to the row's slot in the paged pool (float32 or
// bf16, rounded to nearest even).
#include <string>

#include "common/error.h"
#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"
#include "runtime/cuda/store.cuh"

namespace tandem::runtime::cuda {
namespace {

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
    return (((blk * s.layers + layer) * 2 + kv) * kvh + g) * s.block_size * hd + in_block * hd;
  };
  if (is_v) {  // the whole block takes this branch
    if (active) {
      const int64_t v = pool_at(1, slot - heads - kvh);
      store_as(pool, v + i, a, s.kv);
      store_as(pool, v + i + half, b, s.kv);
    }
    return;
  }
  const float* norm = is_q ? q_norm : k_norm;
  if (norm) {  // the block sums together, so every thread takes part
    const float ss = block_sum(a * a + b * b, partial);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
    if (active) a = norm[i] * (a * inv), b = norm[i + half] * (b * inv);
  }
  if (!active) return;
  const float angle = static_cast<float>(pos) * inv_freq[i];  // as the CPU: float angle, double cos/sin
  const float c = static_cast<float>(cos(static_cast<double>(angle)));
  const float sn = static_cast<float>(sin(static_cast<double>(angle)));
  if (is_q) {
    float* dst = q_out + (r * heads + slot) * hd;
    dst[i] = a * c - b * sn;
    dst[i + half] = b * c + a * sn;
  } else {
    const int64_t k = pool_at(0, slot - heads);
    store_as(pool, k + i, a * c - b * sn, s.kv);
    store_as(pool, k + i + half, b * c + a * sn, s.kv);
  }
}

}  // namespace

void qkv_rope(const float* qkv, int64_t rows, int64_t heads, const float* bias, const float* q_norm, const float* k_norm,
              float eps, const float* inv_freq, RowTables rt, PoolShape shape, int64_t layer, void* pool, float* q_out,
              cudaStream_t stream) {
  if (rows == 0) return;
  if (shape.kv != DType::kF32 && shape.kv != DType::kBF16)
    throw Error("internal: a KV pool holds float32 or bf16, not " + std::string(dtype_name(shape.kv)));
  const int threads = static_cast<int>((shape.head_dim / 2 + 31) / 32 * 32);  // head_dim <= 512: at most 8 warps
  const dim3 grid(static_cast<unsigned>(rows), static_cast<unsigned>(heads + 2 * shape.kv_heads));
  qkv_rope_kernel<<<grid, threads, 0, stream>>>(qkv, heads, bias, q_norm, k_norm, eps, inv_freq, rt, shape, layer, pool,
                                                q_out);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
