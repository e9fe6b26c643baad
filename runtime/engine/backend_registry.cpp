#include "runtime/engine/backend_registry.h"

#include "common/error.h"
#include "runtime/cpu/cpu_model.h"
#ifdef TANDEM_CUDA
#include <cuda_runtime_api.h>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/devices.h"
#include "runtime/cuda/ops.h"
#endif

namespace tandem::runtime {

bool backend_built(std::string_view name) {
  if (name == "cpu") return true;
#ifdef TANDEM_CUDA
  if (name == "cuda") return true;
#endif
  return false;
}

std::string backend_unavailable(std::string_view name) {
  if (name == "cpu") return "";
  if (name != "cuda") return "unknown backend '" + std::string(name) + "'";
#ifdef TANDEM_CUDA
  if (cuda::device_count() == 0) return cuda::devices_summary();
  return "";
#else
  return "this tandem was built without CUDA (rebuild with cmake -DTANDEM_CUDA=ON)";
#endif
}

bool backend_wants_panels(std::string_view name) { return name == "cpu"; }

void bind_device(std::string_view name, int index) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    const int n = cuda::device_count();
    if (index < 0 || n <= 0)
      throw Error("internal: no GPU for device index " + std::to_string(index) + " (" + std::to_string(n) + " visible)");
    if (cudaSetDevice(index % n) != cudaSuccess)
      throw Error("cannot use GPU " + std::to_string(index % n) + " of the " + std::to_string(n) +
                  " visible here (" + cudaGetErrorString(cudaGetLastError()) +
                  "): check CUDA_VISIBLE_DEVICES and the launcher's GPU binding");
  }
#endif
  (void)name;
  (void)index;
}

#ifdef TANDEM_CUDA
namespace {
cudaDeviceProp current_device_props() {
  int device = 0;
  TANDEM_CUDA_CHECK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  TANDEM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return prop;
}
}  // namespace
#endif

std::string device_name(std::string_view name) {
#ifdef TANDEM_CUDA
  if (name == "cuda") return current_device_props().name;
#endif
  (void)name;
  return "";
}

std::string device_uuid(std::string_view name) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    const cudaDeviceProp prop = current_device_props();
    std::string out = "GPU-";
    const char* hex = "0123456789abcdef";
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
      const auto b = static_cast<unsigned char>(prop.uuid.bytes[i]);
      out += hex[b >> 4];
      out += hex[b & 15];
    }
    return out;
  }
#endif
  (void)name;
  return "";
}

std::size_t backend_free_bytes(std::string_view name) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    std::size_t free = 0, total = 0;
    TANDEM_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
  }
#endif
  (void)name;
  return 0;
}

std::shared_ptr<void> allocate_pool_memory(std::string_view name, std::size_t bytes) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    void* p = nullptr;
    TANDEM_CUDA_CHECK(cudaMalloc(&p, bytes));
    TANDEM_CUDA_CHECK(cudaMemset(p, 0, bytes));
    return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
  }
#endif
  (void)name;
  (void)bytes;
  return nullptr;
}

std::shared_ptr<void> allocate_host_memory(std::string_view name, std::size_t bytes) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    void* p = nullptr;
    TANDEM_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocDefault));
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  }
#endif
  (void)name;
  (void)bytes;
  return nullptr;
}

kv::PoolCopy pool_copy(std::string_view name) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    return [](void* dst, const void* src, std::size_t bytes, bool to_pool) {
      TANDEM_CUDA_CHECK(cudaMemcpy(dst, src, bytes, to_pool ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
      // A copy from pageable memory may still be in flight when cudaMemcpy
      // returns, and the model's stream does not wait for the default one.
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    };
  }
#endif
  (void)name;
  return {};
}

PoolCopyRows pool_copy_rows(std::string_view name) {
#ifdef TANDEM_CUDA
  if (name == "cuda") {
    return [](void* dst, const void* src, std::size_t width, std::size_t rows, std::size_t pitch, bool to_pool) {
      TANDEM_CUDA_CHECK(cudaMemcpy2D(dst, to_pool ? pitch : width, src, to_pool ? width : pitch, width, rows,
                                     to_pool ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
      TANDEM_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // as pool_copy: complete before the model's stream reads
    };
  }
#endif
  (void)name;
  return {};
}

std::string backend_model_problem(std::string_view name, const ModelConfig& config) {
#ifdef TANDEM_CUDA
  if (name == "cuda" && config.moe.experts > cuda::kMaxExperts)
    return "routes up to " + std::to_string(cuda::kMaxExperts) + " experts; " + config.architecture + " has " +
           std::to_string(config.moe.experts) + ": use model.backend = \"cpu\"";
#endif
  (void)name;
  (void)config;
  return "";
}

std::unique_ptr<ModelBackend> make_backend(std::string_view name, const ModelConfig& config, const ModelWeights& weights,
                                           kv::BlockPool& pool, cpu::ThreadPool& threads, cpu::TpGroup* group,
                                           DeviceGroup* device_group, bool expert_parallel) {
  if (const std::string why = backend_unavailable(name); !why.empty())
    throw Error("model.backend = \"" + std::string(name) + "\": " + why);
  if (name == "cpu") return std::make_unique<cpu::CpuModel>(config, weights, pool, threads, group, expert_parallel);
  if (const std::string why = backend_model_problem(name, config); !why.empty())
    throw Error("model.backend = \"" + std::string(name) + "\": " + why);
  if (group && group->shard().width > 1 && !device_group)
    throw Error("internal: model.backend = \"" + std::string(name) + "\" in a tensor-parallel group needs the group's "
                "device exchange (NCCL)");
#ifdef TANDEM_CUDA
  return std::make_unique<cuda::CudaModel>(config, weights, pool, device_group, expert_parallel);
#else
  (void)device_group;
  (void)expert_parallel;
  throw Error("internal: backend '" + std::string(name) + "' is not built");
#endif
}

}  // namespace tandem::runtime
