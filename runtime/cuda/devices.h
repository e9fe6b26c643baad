// The CUDA devices this process can see. Built only with TANDEM_CUDA=ON.
#pragma once

#include <string>

namespace tandem::runtime::cuda {

// Number of visible CUDA devices; 0 when there is no GPU or no driver
// (cudaGetDeviceCount fails then, which is not an error for us).
int device_count();

// One line: "CUDA runtime 13.0, 1 device: NVIDIA H200 (sm_90, 139 GiB)" or
// "CUDA runtime 13.0, no device visible (<CUDA's reason>)".
std::string devices_summary();

}  // namespace tandem::runtime::cuda
