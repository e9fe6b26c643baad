#include "router/prefix_order.h"

#include <algorithm>

namespace tandem::router {

std::size_t next_by_shared_prefix(std::span<const std::span<const uint64_t>> window, std::span<const uint64_t> last) {
  std::size_t best = 0, best_len = 0;
  for (std::size_t k = 0; k < window.size(); ++k) {
    const auto& p = window[k];
    const auto n = std::min(p.size(), last.size());
    const auto len = static_cast<std::size_t>(std::mismatch(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(n),
                                                            last.begin()).first - p.begin());
    if (len > best_len) best = k, best_len = len;
  }
  return best;
}

}  // namespace tandem::router
