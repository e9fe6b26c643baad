// Registry of CPU kernel tables: the one place that picks an ISA.
#include "runtime/cpu/kernels.h"

#include <cstdlib>
#include <cstring>

namespace tandem::runtime::cpu {

const KernelTable& kernels() {
  static const KernelTable& chosen = [] () -> const KernelTable& {
    // TANDEM_CPU_KERNELS=scalar|avx2 caps the ISA (the results are the same bits).
    const char* force = std::getenv("TANDEM_CPU_KERNELS");
    if (force && std::strcmp(force, "scalar") == 0) return scalar_kernels();
    const bool no512 = force && std::strcmp(force, "avx2") == 0;
    if (const KernelTable* t = avx512_kernels(); t && !no512) return *t;
    if (const KernelTable* t = avx2_kernels()) return *t;
    return scalar_kernels();
  }();
  return chosen;
}

}  // namespace tandem::runtime::cpu
