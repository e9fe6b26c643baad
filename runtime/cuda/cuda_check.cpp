#include "runtime/cuda/cuda_check.h"

#include <string>

#include "common/error.h"

namespace tandem::runtime::cuda {

void throw_cuda(cudaError_t err, const char* call, const char* file, int line) {
  throw Error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + cudaGetErrorName(err) +
              " (" + cudaGetErrorString(err) + ")");
}

void throw_cublas(cublasStatus_t st, const char* call, const char* file, int line) {
  throw Error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " + cublasGetStatusName(st) +
              " (" + cublasGetStatusString(st) + ")");
}

}  // namespace tandem::runtime::cuda
