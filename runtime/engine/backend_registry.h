// Model backends by name: the one file that knows which were built
// (TANDEM_CUDA appears nowhere else in runtime/).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kv/block_pool.h"
#include "kv/tiers.h"
#include "runtime/cpu/thread_pool.h"
#include "runtime/cpu/tp_group.h"
#include "runtime/engine/backend.h"
#include "runtime/engine/device_group.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace tandem::runtime {

// "cpu" always; "cuda" when built with TANDEM_CUDA.
bool backend_built(std::string_view name);
// Why `name` cannot run here ("" when it can): not built, or no device.
std::string backend_unavailable(std::string_view name);
// Whether the backend reads weights in the CPU's panel layout (ModelWeights::load's `panels`).
bool backend_wants_panels(std::string_view name);

// Makes the calling process compute on device index % devices (no-op for cpu).
void bind_device(std::string_view name, int index);
// The current device's name ("NVIDIA H100 80GB HBM3"), "" for cpu.
std::string device_name(std::string_view name);
// The current device's UUID ("GPU-8-4-4-4-12" hex, as nvidia-smi -L), "" for cpu.
std::string device_uuid(std::string_view name);
// Free memory where the backend computes, in bytes (0 for cpu: use the host's).
std::size_t backend_free_bytes(std::string_view name);

// Memory for a KV pool of `bytes` where the backend computes (device memory
// for cuda), owned by the returned handle; null for cpu (the pool owns host memory).
std::shared_ptr<void> allocate_pool_memory(std::string_view name, std::size_t bytes);

// Page-locked host memory of `bytes` for staging copies to and from the
// backend's pool (cudaHostAlloc), owned by the handle; null for cpu.
std::shared_ptr<void> allocate_host_memory(std::string_view name, std::size_t bytes);

// How the KV tiers reach a pool of this backend (kv/tiers.h); empty for cpu.
kv::PoolCopy pool_copy(std::string_view name);
// Copies of `rows` rows of `width` bytes, `pitch` bytes apart in the pool
// and packed in host memory (a row slice of KV blocks: to_pool, host ->
// pool); empty for cpu.
using PoolCopyRows =
    std::function<void(void* dst, const void* src, std::size_t width, std::size_t rows, std::size_t pitch, bool to_pool)>;
PoolCopyRows pool_copy_rows(std::string_view name);

// Why backend `name` cannot run this model ("" when it can): the CUDA backend routes at most 1024 experts.
std::string backend_model_problem(std::string_view name, const ModelConfig& config);

// The backend; the pool's memory must come from allocate_pool_memory (or the
// pool's own, for cpu). With a tensor-parallel group it computes this rank's
// shard, and the pool holds the shard's KV heads: cpu exchanges through
// `group` (host memory), cuda through `device_group` (device memory; needed
// at a width > 1); a mixture of experts' layers expert-parallel or not
// (cpu/expert_parallel.h). Throws tandem::Error when it is not available.
std::unique_ptr<ModelBackend> make_backend(std::string_view name, const ModelConfig& config, const ModelWeights& weights,
                                           kv::BlockPool& pool, cpu::ThreadPool& threads, cpu::TpGroup* group = nullptr,
                                           DeviceGroup* device_group = nullptr, bool expert_parallel = true);

}  // namespace tandem::runtime
