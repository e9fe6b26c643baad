// Device memory owned by one object (cudaMalloc / cudaFree), move-only.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "runtime/cuda/cuda_check.h"

namespace tandem::runtime::cuda {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t count) { resize(count); }
  DeviceBuffer(DeviceBuffer&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      release();
      p_ = std::exchange(o.p_, nullptr);
      n_ = std::exchange(o.n_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { release(); }

  // At least `count` elements (growing by half as much again, so that a
  // slowly growing need moves it rarely); the contents are lost when it
  // moves. True when it moved (a new address).
  bool resize(std::size_t count) {
    if (count <= n_) return false;
    const std::size_t grown = n_ == 0 ? count : std::max(count, n_ + n_ / 2);
    release();
    TANDEM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p_), grown * sizeof(T)));
    n_ = grown;
    return true;
  }
  T* get() const { return p_; }
  std::size_t size() const { return n_; }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  std::size_t n_ = 0;
};

}  // namespace tandem::runtime::cuda
