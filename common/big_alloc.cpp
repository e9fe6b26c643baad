#include "common/big_alloc.h"

#include <sys/mman.h>

#include <new>

namespace tandem {

std::shared_ptr<void> allocate_big(std::size_t bytes) {
  if (bytes == 0) bytes = 1;
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
}

}  // namespace tandem
