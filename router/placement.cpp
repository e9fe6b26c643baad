#include "router/placement.h"

namespace tandem::router {

PlacementChoice place(int64_t prompt_tokens, std::span<const Candidate> decode, std::span<const Candidate> prefill,
                      const PlacementOptions& o, uint64_t turn) {
  PlacementChoice p;
  const int64_t blocks = (prompt_tokens + o.block_size - 1) / o.block_size;
  p.worker = choose_worker(o.policy, decode, blocks, o.weights, turn);
  const Candidate& chosen = decode[p.worker];
  // Blocks in its pool or host memory are copied in, not moved or computed.
  const int64_t uncached = prompt_tokens - (chosen.overlap_blocks + chosen.overlap_host) * o.block_size;
  if (prefill.empty() || uncached < o.local_prefill_tokens) return p;
  // Round robin would spread prompts blindly over prefill workers whose queues differ: KV-aware instead.
  const RoutePolicy policy = o.policy == RoutePolicy::kRoundRobin ? RoutePolicy::kKvAware : o.policy;
  auto node = [&o](int rank) {
    return rank >= 0 && static_cast<std::size_t>(rank) < o.node_of.size() ? o.node_of[static_cast<std::size_t>(rank)] : 0;
  };
  std::vector<Candidate> pre_c(prefill.begin(), prefill.end());
  const int64_t sent = (uncached + o.block_size - 1) / o.block_size;  // the blocks the prefill sends
  for (Candidate& c : pre_c) c.remote_blocks = node(c.rank) != node(chosen.rank) ? sent : 0;
  const std::size_t pre = choose_worker(policy, pre_c, blocks, o.weights, turn);
  if (prefill[pre].queued_tokens < o.prefill_saturation_tokens) p.prefill = static_cast<int>(pre);
  return p;
}

}  // namespace tandem::router
