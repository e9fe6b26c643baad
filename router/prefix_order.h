// Offline reordering (router.reorder_window), as a value: which of the
// requests waiting in the window goes next. No clock, no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace tandem::router {

// Index of the window entry whose prompt shares the most leading full blocks
// (block hashes, kv/block_hash.h) with the prompt placed last; ties and no
// sharing at all go to the oldest (index 0 is the oldest). Requests with a
// common prefix thus leave together, and groups in order of first arrival.
std::size_t next_by_shared_prefix(std::span<const std::span<const uint64_t>> window, std::span<const uint64_t> last);

}  // namespace tandem::router
