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
    const double overlap = w.overlap_weight * static_cast<double>(x.overlap_blocks) +
                           w.overlap_weight_host * static_cast<double>(x.overlap_host) +
                           w.overlap_weight_disk * static_cast<double>(x.overlap_disk);
    const double uncached = std::max(0.0, static_cast<double>(prompt_blocks) - overlap);
    return w.prefill_load_scale * (uncached + static_cast<double>(x.queued_tokens) / 16.0) +
           static_cast<double>(x.active_blocks) + w.request_weight * static_cast<double>(x.active_requests) +
           w.kv_between_nodes * static_cast<double>(x.remote_blocks);
  };
  std::size_t best = 0;
  for (std::size_t i = 1; i < c.size(); ++i) {
    const double a = cost(c[i]), b = cost(c[best]);
    if (a < b || (a == b && c[i].rank < c[best].rank)) best = i;
  }
  return best;
}

void KvIndex::stored(int rank, std::span<const uint64_t> hashes, Where where) {
  auto& sets = where == Where::kDevice ? device_ : host_;
  if (rank >= static_cast<int>(sets.size())) sets.resize(static_cast<std::size_t>(rank) + 1);
  sets[static_cast<std::size_t>(rank)].insert(hashes.begin(), hashes.end());
}

void KvIndex::removed(int rank, std::span<const uint64_t> hashes, Where where) {
  auto& sets = where == Where::kDevice ? device_ : host_;
  if (rank >= static_cast<int>(sets.size())) return;
  for (uint64_t h : hashes) sets[static_cast<std::size_t>(rank)].erase(h);
}

void KvIndex::stored_on_disk(std::span<const uint64_t> hashes) { disk_.insert(hashes.begin(), hashes.end()); }

Overlap KvIndex::overlap(int rank, std::span<const uint64_t> prompt) const {
  static const std::unordered_set<uint64_t> kNone;
  const auto r = static_cast<std::size_t>(rank);
  const auto& dev = rank >= 0 && r < device_.size() ? device_[r] : kNone;
  const auto& host = rank >= 0 && r < host_.size() ? host_[r] : kNone;
  Overlap o;
  for (uint64_t h : prompt) {
    if (dev.count(h)) ++o.device;
    else if (host.count(h)) ++o.host;
    else if (disk_.count(h)) ++o.disk;
    else break;
  }
  return o;
}

}  // namespace tandem::router
