// Where a request runs, as one pure function that the job's dispatcher and
// the planner's simulator both call: the decode (or aggregated) worker by
// the routing policy over the candidates' cached overlap and load, then,
// disaggregated, whether to prefill remotely (conditional disaggregation:
// only what the chosen worker has not cached, when it is long enough) and on
// which prefill worker, unless every one is saturated. All state comes in
// as arguments: no clock, no globals.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "router/kv_aware_policy.h"

namespace tandem::router {

struct PlacementOptions {
  RoutePolicy policy = RoutePolicy::kKvAware;
  RouteWeights weights;
  int64_t block_size = 16;
  int64_t local_prefill_tokens = 0;  // shorter uncached prompts prefill on their decode worker
  // Prompt tokens queued on a prefill worker that count as saturated: past
  // them the prompt prefills on its decode worker instead of waiting.
  int64_t prefill_saturation_tokens = int64_t{1} << 40;
  // Each rank's node (any numbering), by rank; empty: one node. A remote
  // prefill on another node than its decode worker's costs its KV's blocks
  // at weights.kv_between_nodes.
  std::vector<int> node_of;
};

// The saturation the job uses: 64 engine steps' worth of prompt tokens.
constexpr int64_t default_prefill_saturation(int64_t max_batched_tokens) { return 64 * max_batched_tokens; }

struct PlacementChoice {
  std::size_t worker = 0;  // index into the decode candidates
  int prefill = -1;        // index into the prefill candidates; -1: prefilled on the worker
};

// decode: the workers that may take the request (non-empty), each with its
// overlap with the prompt and its load; prefill: the prefill-only workers
// (empty when aggregated), each with its overlap and queued prompt tokens.
// turn: the caller's counter, for round robin.
PlacementChoice place(int64_t prompt_tokens, std::span<const Candidate> decode, std::span<const Candidate> prefill,
                      const PlacementOptions& options, uint64_t turn);

}  // namespace tandem::router
