#include "runtime/cpu/tp_group.h"

#include "runtime/cpu/row_parallel.h"

namespace tandem::runtime::cpu {

std::string tp_problem(const ModelConfig& c, int width, bool expert_parallel) {
  const std::string w = std::to_string(width);
  if (width != 1 && width != 2 && width != 4 && width != 8) return "a tensor-parallel width is 1, 2, 4 or 8, not " + w;
  if (c.heads % width != 0)
    return "a width of " + w + " does not divide the model's " + std::to_string(c.heads) + " attention heads";
  if (c.kv_heads % width != 0 && width % c.kv_heads != 0)
    return "a width of " + w + " neither divides the model's " + std::to_string(c.kv_heads) +
           " KV heads nor is a multiple of them";
  if (c.intermediate < kReduceChunks) return "the model's MLP is too narrow to split";
  if (c.moe.any() && width > 1 && expert_parallel && c.moe.experts % width != 0)
    return "a width of " + w + " does not divide the model's " + std::to_string(c.moe.experts) +
           " experts (expert parallelism gives each rank whole experts): choose a width that divides them, or set "
           "cluster.expert_parallel = false to split every expert across the ranks instead";
  return "";
}

std::string experts_problem(const ModelConfig& c) {
  if (!c.moe.any() || c.moe.intermediate >= kReduceChunks) return "";
  return "the model's experts are too narrow (moe_intermediate_size " + std::to_string(c.moe.intermediate) + " < " +
         std::to_string(kReduceChunks) + ") for the fixed reduction tree";
}

ModelConfig shard_config(const ModelConfig& c, TpShard s) {
  ModelConfig l = c;
  l.heads = c.heads / s.width;
  l.kv_heads = c.kv_heads >= s.width ? c.kv_heads / s.width : 1;
  const int per = kReduceChunks / s.width;
  l.intermediate = chunk_begin(c.intermediate, (s.rank + 1) * per) - chunk_begin(c.intermediate, s.rank * per);
  return l;
}

ModelConfig local_config(const ModelConfig& c, TpShard s, bool expert_parallel) {
  ModelConfig l = shard_config(c, s);
  if (c.moe.any() && !expert_parallel) {
    const int per = kReduceChunks / s.width;
    l.moe.intermediate = chunk_begin(c.moe.intermediate, (s.rank + 1) * per) - chunk_begin(c.moe.intermediate, s.rank * per);
  }
  return l;
}

ShardOffsets shard_offsets(const ModelConfig& c, TpShard s) {
  ShardOffsets o;
  o.head = s.rank * (c.heads / s.width);
  o.kv_head = c.kv_heads >= s.width ? s.rank * (c.kv_heads / s.width) : s.rank * c.kv_heads / s.width;
  o.unit = chunk_begin(c.intermediate, s.rank * (kReduceChunks / s.width));
  o.expert_unit = chunk_begin(c.moe.intermediate, s.rank * (kReduceChunks / s.width));
  return o;
}

}  // namespace tandem::runtime::cpu
