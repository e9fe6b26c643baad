#include "mpi_transport/device_pool.h"

#include <algorithm>
#include <bit>

namespace tandem::mpi {

StagingBuffers::StagingBuffers(std::function<std::shared_ptr<void>(std::size_t)> allocate_host)
    : allocate_(std::move(allocate_host)) {
  if (!allocate_) {
    allocate_ = [](std::size_t bytes) {
      return std::shared_ptr<void>(new uint8_t[bytes], [](void* p) { delete[] static_cast<uint8_t*>(p); });
    };
  }
}

StagingBuffers::Buffer StagingBuffers::take(std::size_t bytes) {
  auto best = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it)
    if (it->capacity >= bytes && (best == free_.end() || it->capacity < best->capacity)) best = it;
  if (best != free_.end()) {
    Buffer b = std::move(*best);
    free_.erase(best);
    return b;
  }
  const std::size_t capacity = std::bit_ceil(std::max<std::size_t>(bytes, 4096));
  ++allocations_;
  std::shared_ptr<void> memory = allocate_(capacity);
  if (!memory) memory = std::shared_ptr<void>(new uint8_t[capacity], [](void* p) { delete[] static_cast<uint8_t*>(p); });
  return Buffer{std::move(memory), capacity};
}

void StagingBuffers::give_back(Buffer b) {
  if (!b.memory) return;
  free_.push_back(std::move(b));
  if (free_.size() > kKeep) {
    auto smallest = std::min_element(free_.begin(), free_.end(),
                                     [](const Buffer& x, const Buffer& y) { return x.capacity < y.capacity; });
    free_.erase(smallest);
  }
}

}  // namespace tandem::mpi
