// Large, long-lived buffers (KV pools): anonymous memory mapped directly,
// zero until first written. Pages are only touched when written, so an
// unused part of a large pool costs no memory and no start-up time (a
// zero-initialised new[] touched all of it).
//
// No huge pages here: a pool's rows for consecutive positions are a power
// of two apart (kv_heads x head_dim elements), and physically contiguous
// 2 MiB pages could put them in few cache sets; unmeasured (this machine's
// timings were too noisy to tell), so the weights keep MADV_HUGEPAGE and the
// pool does not ask.
#pragma once

#include <cstddef>
#include <memory>

namespace tandem {

// bytes of zeroed, page-aligned memory; freed when the last owner goes.
// Throws std::bad_alloc when the mapping fails.
std::shared_ptr<void> allocate_big(std::size_t bytes);

}  // namespace tandem
