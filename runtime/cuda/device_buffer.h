// Device memory (cudaMalloc) or page-locked host memory (cudaMallocHost: the
// staging of asynchronous copies) owned by one object, move-only.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace tandem::runtime::cuda {

// The elements a buffer of n holds after resize(count): n where that holds count, else count or half as much
// again as n, whichever is more.
inline std::size_t grown_size(std::size_t n, std::size_t count) {
  return count <= n ? n : n == 0 ? count : std::max(count, n + n / 2);
}

template <class T, bool Pinned>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  explicit CudaBuffer(std::size_t count) { resize(count); }
  CudaBuffer(CudaBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  CudaBuffer& operator=(CudaBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { release(); }

  // At least `count` elements (growing by half as much again, so that a
  // slowly growing need moves it rarely); the contents are lost when it
  // moves. True when it moved (a new address).
  bool resize(std::size_t count) {
    if (count <= n_) return false;
    const std::size_t grown = grown_size(n_, count);
    release();
    if constexpr (Pinned) TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&p_), grown * sizeof(T)));
    else TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), grown * sizeof(T)));
    n_ = grown;
    return true;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void release() {
    if (p_) {
      if constexpr (Pinned) cudaFreeHost(p_);
      else cudaFree(p_);
    }
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

template <class T>
using DeviceBuffer = CudaBuffer<T, false>;
template <class T>
using PinnedBuffer = CudaBuffer<T, true>;

}  // namespace tandem::runtime::cuda
