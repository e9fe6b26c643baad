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
  const std::size_t pre = choose_worker(policy, prefill, blocks, o.weights, turn);
  if (prefill[pre].queued_tokens < o.prefill_saturation_tokens) p.prefill = static_cast<int>(pre);
  return p;
}

}  // namespace tandem::router
