#include "runtime/cuda/launch.cuh"
#include "runtime/cuda/ops.h"

namespace tandem::runtime::cuda {
namespace {

__global__ void kv_write_kernel(const float* k, const float* v, RowTables rt, PoolShape s, int64_t layer, float* pool) {
  const int64_t r = blockIdx.x, width = s.kv_heads * s.head_dim;
  const int64_t pos = rt.positions[r];
  const int64_t blk = rt.tables[rt.table_of[r] + pos / s.block_size], slot = pos % s.block_size;
  // offset(block, layer, kv, slot), as kv::KvLayout::offset
  const int64_t base_k = ((blk * s.layers + layer) * 2 + 0) * s.block_size * width + slot * width;
  const int64_t base_v = ((blk * s.layers + layer) * 2 + 1) * s.block_size * width + slot * width;
  for (int64_t i = threadIdx.x; i < width; i += blockDim.x) {
    pool[base_k + i] = k[r * width + i];
    pool[base_v + i] = v[r * width + i];
  }
}

}  // namespace

void kv_write(const float* k, const float* v, int64_t rows, RowTables rt, PoolShape shape, int64_t layer, float* pool,
              cudaStream_t stream) {
  if (rows == 0) return;
  kv_write_kernel<<<static_cast<unsigned>(rows), 128, 0, stream>>>(k, v, rt, shape, layer, pool);
  TANDEM_CUDA_LAUNCHED();
}

}  // namespace tandem::runtime::cuda
