// Tensor parallelism as the CPU model sees it: a group of `width` ranks
// runs one worker's model, each with a shard of it (Megatron's split):
// attention heads and the MLP's intermediate units are divided, q/k/v and
// gate/up by rows (column-parallel), o_proj and down_proj by their reduced
// columns (row-parallel, in the fixed chunks of row_parallel.h, so that the
// group's sum is the same bits at every width). The embedding, the norms
// and the LM head are replicated: every rank holds the whole hidden vector
// after each exchange and computes the same logits. Where the width passes
// the KV head count, each KV head is replicated on width / kv_heads ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "runtime/model/model_config.h"

namespace tandem::runtime::cpu {

struct TpShard {
  int rank = 0;
  int width = 1;
};

class TpGroup {
 public:
  virtual ~TpGroup() = default;
  virtual TpShard shard() const = 0;
  // data: this rank's partial sum of a row-parallel product, n floats (the
  // subtree of its chunks). On return, on every rank, the group's sum: the
  // ranks' partial sums added in rank order in the fixed tree.
  virtual void reduce_tree(float* data, int64_t n) = 0;
  // Whole KV blocks for the tiers below the leader's pool (group rank 0):
  // gather: every rank's `bytes` at `mine` into `all` on rank 0 ([width][bytes];
  // ignored elsewhere); scatter: rank 0's `all` ([width][bytes]) out, each
  // rank's part into `mine`. Collective, in the order of the group's other calls.
  virtual void gather(const void* mine, std::size_t bytes, void* all) = 0;
  virtual void scatter(const void* all, std::size_t bytes, void* mine) = 0;
  // Expert parallelism's exchanges (expert_parallel.h). Every rank computes
  // every count from the same routing, so none is sent. all_to_all: this rank
  // sends send_counts[q] floats to rank q, taken from `send` in rank order,
  // and receives recv_counts[q] floats from rank q into `recv` in rank order
  // (its own part as well). all_gather: counts[q] floats of every rank q into
  // `all` in rank order, on every rank; this rank's from `mine`.
  virtual void all_to_all(const float* send, std::span<const int64_t> send_counts, float* recv,
                          std::span<const int64_t> recv_counts) = 0;
  virtual void all_gather(const float* mine, std::span<const int64_t> counts, float* all) = 0;
};

// Why `width` cannot shard this model, or "" when it can: 1, 2, 4 or 8,
// dividing the attention heads, and dividing the KV heads or divided by them;
// for a mixture of experts, dividing the experts (expert_parallel: each rank
// holds whole experts) or their units (not: every expert split as the dense MLP).
std::string tp_problem(const ModelConfig& c, int width, bool expert_parallel = true);
// Why a mixture of experts' experts cannot be cut into the fixed tree's
// chunks at any width (fewer units than chunks), or "" when they can.
std::string experts_problem(const ModelConfig& c);

// The model as one rank of the group computes it: its heads, KV heads and
// intermediate units (hidden, vocabulary and the rest unchanged).
ModelConfig shard_config(const ModelConfig& c, TpShard s);
// shard_config's, and for a mixture of experts without expert parallelism
// the rank's share of each expert's units as well (moe.intermediate).
ModelConfig local_config(const ModelConfig& c, TpShard s, bool expert_parallel);

// The first of the rank's attention heads, KV heads and intermediate units
// (and of each expert's units, where experts are split rather than placed whole).
struct ShardOffsets {
  int64_t head = 0, kv_head = 0, unit = 0, expert_unit = 0;
};
ShardOffsets shard_offsets(const ModelConfig& c, TpShard s);

}  // namespace tandem::runtime::cpu
