#include "runtime/cuda/devices.h"

#include <cuda_runtime_api.h>

namespace tandem::runtime::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

std::string devices_summary() {
  int rt = 0;
  cudaRuntimeGetVersion(&rt);
  std::string out = "CUDA runtime " + std::to_string(rt / 1000) + "." + std::to_string(rt % 1000 / 10);
  int n = 0;
  if (cudaError_t err = cudaGetDeviceCount(&n); err != cudaSuccess || n == 0) {
    return out + ", no device visible (" + (err != cudaSuccess ? cudaGetErrorString(err) : "0 devices") + ")";
  }
  out += ", " + std::to_string(n) + (n == 1 ? " device:" : " devices:");
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out += std::string(i ? "; " : " ") + p.name + " (sm_" + std::to_string(p.major) + std::to_string(p.minor) +
           ", " + std::to_string(p.totalGlobalMem >> 30) + " GiB)";
  }
  return out;
}

}  // namespace tandem::runtime::cuda
