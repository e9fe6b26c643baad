// Choosing workers, as a value: all state comes in as arguments, no clock,
// no globals, so tests replay it from tables and the simulator reuses it.
//
// KV-aware choice (Dynamo's cost): for each candidate,
//   cost = prefill_load_scale * max(prompt_blocks - overlap_blocks, 0)
//        + active_blocks + request_weight * active_requests
// where overlap_blocks is how many leading blocks of the prompt the worker
// has cached; the lowest cost wins, ties go to the lowest rank.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace tandem::router {

struct Candidate {
  int rank = 0;
  int64_t overlap_blocks = 0;   // leading prompt blocks cached on this worker
  int64_t active_blocks = 0;    // KV blocks its in-flight requests hold (router's estimate)
  int64_t active_requests = 0;
  int64_t queued_tokens = 0;    // prompt tokens waiting to be prefilled there
};

enum class RoutePolicy { kKvAware, kRoundRobin, kLeastLoaded };
RoutePolicy parse_route_policy(const std::string& name);  // "kv_aware" | "round_robin" | "least_loaded"

struct RouteWeights {
  double prefill_load_scale = 1.0;
  double request_weight = 1.0;
  double overlap_weight = 1.0;  // router.overlap_weight_device: value of a cached block
};

// Index of the chosen candidate. `turn` drives round robin (the caller's counter).
std::size_t choose_worker(RoutePolicy policy, std::span<const Candidate> candidates, int64_t prompt_blocks,
                          const RouteWeights& weights, uint64_t turn);

// What rank 0 knows of each worker's prefix cache, from the workers' reports.
class KvIndex {
 public:
  void stored(int rank, std::span<const uint64_t> hashes);
  void removed(int rank, std::span<const uint64_t> hashes);
  // Leading hashes of `prompt` cached on `rank`.
  int64_t overlap(int rank, std::span<const uint64_t> prompt) const;

 private:
  std::vector<std::unordered_set<uint64_t>> by_rank_;
};

}  // namespace tandem::router
