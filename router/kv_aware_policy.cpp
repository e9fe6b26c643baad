#include "router/kv_aware_policy.h"

#include <algorithm>

#include "common/error.h"

namespace tandem::router {

RoutePolicy parse_route_policy(const std::string& name) {
  if (name == "kv_aware") return RoutePolicy::kKvAware;
  if (name == "round_robin") return RoutePolicy::kRoundRobin;
  if (name == "least_loaded") return RoutePolicy::kLeastLoaded;
  throw Error("router.policy must be \"kv_aware\", \"round_robin\" or \"least_loaded\", got \"" + name + "\"");
}

std::size_t choose_worker(RoutePolicy policy, std::span<const Candidate> c, int64_t prompt_blocks,
                          const RouteWeights& w, uint64_t turn) {
  if (c.empty()) return 0;
  if (policy == RoutePolicy::kRoundRobin) return static_cast<std::size_t>(turn % c.size());
  auto cost = [&](const Candidate& x) {
    if (policy == RoutePolicy::kLeastLoaded)
      return static_cast<double>(x.active_requests) + static_cast<double>(x.queued_tokens) * 1e-6;
    const double uncached = std::max(0.0, static_cast<double>(prompt_blocks) -
                                              w.overlap_weight * static_cast<double>(x.overlap_blocks));
    return w.prefill_load_scale * (uncached + static_cast<double>(x.queued_tokens) / 16.0) +
           static_cast<double>(x.active_blocks) + w.request_weight * static_cast<double>(x.active_requests);
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < c.size(); ++i) {
    const double a = cost(c[i]), b = cost(c[best]);
    if (a < b || (a == b && c[i].rank < c[best].rank)) best = i;
  }
  return best;
}

void KvIndex::stored(int rank, std::span<const uint64_t> hashes) {
  if (rank >= static_cast<int>(by_rank_.size())) by_rank_.resize(static_cast<std::size_t>(rank) + 1);
  by_rank_[static_cast<std::size_t>(rank)].insert(hashes.begin(), hashes.end());
}

void KvIndex::removed(int rank, std::span<const uint64_t> hashes) {
  if (rank >= static_cast<int>(by_rank_.size())) return;
  for (uint64_t h : hashes) by_rank_[static_cast<std::size_t>(rank)].erase(h);
}

int64_t KvIndex::overlap(int rank, std::span<const uint64_t> prompt) const {
  if (rank >= static_cast<int>(by_rank_.size())) return 0;
  const auto& set = by_rank_[static_cast<std::size_t>(rank)];
  int64_t n = 0;
  for (uint64_t h : prompt) {
    if (!set.count(h)) break;
    ++n;
  }
  return n;
}

}  // namespace tandem::router
