// The one checking wrapper for CUDA runtime and cuBLAS calls (as mpi_check.h
// is for MPI): a failed call throws tandem::Error naming the call, file:line
// and the library's own error string.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

namespace tandem::runtime::cuda {

[[noreturn]] void throw_cuda(cudaError_t err, const char* call, const char* file, int line);
[[noreturn]] void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line);

}  // namespace tandem::runtime::cuda

#define TANDEM_CUDA_CHECK(call)                                                                    \
  do {                                                                                             \
    const cudaError_t tandem_err_ = (call);                                                        \
    if (tandem_err_ != cudaSuccess) ::tandem::runtime::cuda::throw_cuda(tandem_err_, #call, __FILE__, __LINE__); \
  } while (0)

#define TANDEM_CUBLAS_CHECK(call)                                                                   \
  do {                                                                                              \
    const cublasStatus_t tandem_st_ = (call);                                                       \
    if (tandem_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::tandem::runtime::cuda::throw_cublas(tandem_st_, #call, __FILE__, __LINE__);                \
  } while (0)
