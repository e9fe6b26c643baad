// Shared by the .cu files: grid sizes and the launch check.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/cuda/cuda_check.h"

namespace tandem::runtime::cuda {

inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace tandem::runtime::cuda

// After a launch: a bad configuration is reported where it happened.
#define TANDEM_CUDA_LAUNCHED() TANDEM_CUDA_CHECK(cudaGetLastError())
