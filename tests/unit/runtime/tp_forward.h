// One rank's forward passes for the tensor-parallel tests (in-process
// threads, tests/unit/runtime/tp_test.cpp; MPI ranks, tests/mpi/tp_group_test.cpp).
#pragma once

#include <algorithm>
#include <numeric>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/cpu/cpu_model.h"
#include "runtime/cpu/tp_group.h"

namespace tandem::testing {

// A prefill of `prompt` (logits for every position), then `steps` greedy
// decode steps; every logit of every step, as one rank of a group computes them.
inline std::vector<float> tp_forward(const runtime::ModelConfig& c, const runtime::ModelWeights& w,
                                     runtime::cpu::TpGroup* group, const std::vector<int32_t>& prompt, int steps,
                                     bool expert_parallel = true, int64_t kv_elem_bytes = 4) {
  const runtime::ModelConfig local = group ? runtime::cpu::shard_config(c, group->shard()) : c;
  kv::KvLayout layout{c.layers, local.kv_heads, c.head_dim, 16};
  layout.elem_bytes = kv_elem_bytes;  // 4 f32, 2 bf16, 1 FP8 (kv.dtype)
  kv::BlockPool pool(layout, 8);
  runtime::cpu::ThreadPool threads(1);
  runtime::cpu::CpuModel model(c, w, pool, threads, group, expert_parallel);
  std::vector<int32_t> blocks(8);
  std::iota(blocks.begin(), blocks.end(), 0);
  std::vector<float> all, logits;
  std::vector<int32_t> tokens = prompt;
  runtime::SeqChunk ch;
  ch.start_pos = 0;
  ch.tokens = tokens;
  ch.block_table = blocks;
  ch.logits_all = true;
  model.forward({&ch, 1}, logits);
  all.insert(all.end(), logits.begin(), logits.end());
  for (int s = 0; s < steps; ++s) {
    const auto last = logits.end() - c.vocab;
    const int32_t next = static_cast<int32_t>(std::max_element(last, logits.end()) - last);
    const int64_t pos = static_cast<int64_t>(prompt.size()) + s;
    std::vector<int32_t> one{next};
    runtime::SeqChunk d;
    d.start_pos = pos;
    d.tokens = one;
    d.block_table = blocks;
    d.logits_last = true;
    model.forward({&d, 1}, logits);
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

}  // namespace tandem::testing
