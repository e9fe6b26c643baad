// Choosing workers, as a value: all state comes in as arguments, no clock,
// no globals, so tests replay it from tables and the simulator reuses it.
//
// KV-aware choice (Dynamo's cost): for each candidate,
//   cost = prefill_load_scale * max(prompt_blocks - overlap, 0)
//        + active_blocks + request_weight * active_requests
// where overlap weighs the leading blocks of the prompt the worker can get
// without computing them by where they are: in its pool (overlap_weight,
// 1.0), in its host memory (0.75) or in the disk store (0.25) — Dynamo's
// defaults. A prefill worker that would send the KV to another node than
// the decode worker's pays kv_between_nodes per block it sends. The lowest
// cost wins, ties go to the lowest rank.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

namespace tandem::router {

struct Candidate {
  int rank = 0;
  int64_t overlap_blocks = 0;   // leading prompt blocks cached in this worker's pool
  int64_t active_blocks = 0;    // KV blocks its in-flight requests hold (router's estimate)
  int64_t active_requests = 0;
  int64_t queued_tokens = 0;    // prompt tokens waiting to be prefilled there
  int64_t overlap_host = 0;     // the blocks after overlap_blocks in its host memory (G2)
  int64_t overlap_disk = 0;     // the blocks after those in the disk store (G3)
  int64_t remote_blocks = 0;    // KV blocks choosing it would send to another node
};

enum class RoutePolicy { kKvAware, kRoundRobin, kLeastLoaded };
RoutePolicy parse_route_policy(const std::string& name);  // "kv_aware" | "round_robin" | "least_loaded"

struct RouteWeights {
  double prefill_load_scale = 1.0;
  double request_weight = 1.0;
  double overlap_weight = 1.0;  // router.overlap_weight_device: value of a cached block
  double overlap_weight_host = 0.75;
  double overlap_weight_disk = 0.25;
  double kv_between_nodes = 0.5;  // router.kv_between_nodes_weight: cost of a block sent between nodes
};

// Index of the chosen candidate. `turn` drives round robin (the caller's counter).
std::size_t choose_worker(RoutePolicy policy, std::span<const Candidate> candidates, int64_t prompt_blocks,
                          const RouteWeights& weights, uint64_t turn);

// What rank 0 knows of each worker's cached blocks, from the workers'
// reports: per rank in its pool and in its host memory; the disk store is
// one set, readable by every worker.
struct Overlap {
  int64_t device = 0, host = 0, disk = 0;
  int64_t total() const { return device + host + disk; }
};

class KvIndex {
 public:
  enum class Where { kDevice, kHost };
  void stored(int rank, std::span<const uint64_t> hashes, Where where = Where::kDevice);
  void removed(int rank, std::span<const uint64_t> hashes, Where where = Where::kDevice);
  void stored_on_disk(std::span<const uint64_t> hashes);
  // Everything `rank`'s pool held (it was emptied); its host memory and the store keep theirs.
  void forget_device(int rank) {
    if (rank >= 0 && rank < static_cast<int>(device_.size())) device_[static_cast<std::size_t>(rank)].clear();
  }
  // The leading hashes of `prompt` that `rank` has, each counted at the
  // fastest tier holding it (the chain stops at the first block held nowhere).
  Overlap overlap(int rank, std::span<const uint64_t> prompt) const;

 private:
  std::vector<std::unordered_set<uint64_t>> device_, host_;
  std::unordered_set<uint64_t> disk_;
};

}  // namespace tandem::router
