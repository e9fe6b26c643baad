#include "topology/cells.h"

#include <algorithm>

namespace tandem::topology {

Groups cell_groups(int key, int cell, int width) {
  Groups out;
  for (int leader = key; leader < key + cell; leader += width) {
    out.emplace_back();
    for (int r = leader; r < leader + width; ++r) out.back().push_back(r);
  }
  return out;
}

std::vector<Cell> job_cells(const Roles& roles, int cell) {
  std::vector<Cell> out;
  if (cell > 0) {
    for (int key = 1; key < 1 + roles.ranks.prefill + roles.ranks.decode; key += cell) {
      const Side s = key <= roles.ranks.prefill ? Side::kPrefill : Side::kDecode;
      out.push_back({{cell_groups(key, cell, roles.width(Side::kPrefill)), cell_groups(key, cell, roles.width(Side::kDecode))},
                     s, s});
    }
    return out;
  }
  for (Side s : kSides)
    for (auto& g : roles.map().groups(s)) out.push_back({{{g}, {g}}, s, s});
  std::sort(out.begin(), out.end(), [](const Cell& a, const Cell& b) { return a.key() < b.key(); });
  return out;
}

uint64_t cell_pool_bytes(double want_a, double room_a, double want_b, double room_b, uint64_t block_a, uint64_t block_b) {
  const double bytes = std::min({room_a, room_b, std::max(want_a, want_b)});
  return std::max(static_cast<uint64_t>(bytes), std::max(block_a, block_b));
}

}  // namespace tandem::topology
