// A KV pool outside host memory (a GPU's) as seen by a transport that moves
// bytes through host memory (two-sided MPI): the transport never touches the
// pool itself, only copies runs of blocks between it and host staging
// buffers. This is the path for GPU workers where NCCL is not built or not
// wanted; NCCL moves device memory directly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

namespace tandem::mpi {

struct DevicePool {
  // The pool's memory, `bytes` of it, owned by the handle.
  std::function<std::shared_ptr<void>(std::size_t bytes)> allocate;
  // Copies between the pool and host memory; to_pool: host -> pool. Complete on return.
  std::function<void(void* dst, const void* src, std::size_t bytes, bool to_pool)> copy;
  // The same for `rows` rows of `width` bytes, `pitch` bytes apart on the pool's side and packed on the
  // host's (a row slice of a block, cudaMemcpy2D); empty: the transport moves whole blocks only.
  std::function<void(void* dst, const void* src, std::size_t width, std::size_t rows, std::size_t pitch, bool to_pool)>
      copy_rows;
  // Host memory for staging (page-locked for a GPU, so copies run at full speed); empty: plain new[].
  std::function<std::shared_ptr<void>(std::size_t bytes)> allocate_host;
  explicit operator bool() const { return static_cast<bool>(allocate); }
};

// Host buffers recycled across transfers: a transfer's message lives until its
// send completes, and fresh pages (or page-locked ones) are slow to get.
class StagingBuffers {
 public:
  struct Buffer {
    std::shared_ptr<void> memory;
    std::size_t capacity = 0;
    uint8_t* data() const { return static_cast<uint8_t*>(memory.get()); }
  };
  explicit StagingBuffers(std::function<std::shared_ptr<void>(std::size_t)> allocate_host = {});
  // The smallest kept buffer of at least `bytes`, else a new one (rounded up to a power of two).
  Buffer take(std::size_t bytes);
  // Keeps `b` for later unless kKeep buffers are kept already (then the smallest goes).
  void give_back(Buffer b);
  int64_t allocations() const { return allocations_; }

  static constexpr std::size_t kKeep = 8;

 private:
  std::function<std::shared_ptr<void>(std::size_t)> allocate_;
  std::vector<Buffer> free_;
  int64_t allocations_ = 0;
};

}  // namespace tandem::mpi
