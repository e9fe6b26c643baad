// What the MPI benchmarks share (tp_bench, moe_bench): a median, a barrier
// that does not spin, and a model's prefill and decode speed as one rank of
// a group computes them.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "kv/block_pool.h"
#include "runtime/cpu/cpu_model.h"

namespace tandem::perf {

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// An idle rank waits without spinning (a blocking MPI_Barrier polls a core).
inline void quiet_barrier() {
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  for (int done = 0; !done;) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

struct Speed {
  double prefill = 0, decode = 0;  // tokens/s
  double experts_touched = 0;      // a mixture of experts: experts a decode step read, per MoE layer (mean)
};

// `seqs` prompts of `len` tokens prefilled one by one, then `steps` decode
// steps of all of them together, as this rank of `group` (null: alone).
inline Speed run_model(const runtime::ModelConfig& c, const runtime::ModelWeights& w, runtime::cpu::TpGroup* group,
                       int threads_n, int seqs, int len, int steps, bool expert_parallel = true) {
  using Clock = std::chrono::steady_clock;
  const auto local = group ? runtime::cpu::shard_config(c, group->shard()) : c;
  const int64_t per_seq = (len + steps) / 16 + 2;
  kv::BlockPool pool({c.layers, local.kv_heads, c.head_dim, 16}, seqs * per_seq);
  runtime::cpu::ThreadPool threads(threads_n);
  runtime::cpu::CpuModel model(c, w, pool, threads, group, expert_parallel);
  std::vector<std::vector<int32_t>> tables(static_cast<std::size_t>(seqs)), prompts(tables.size());
  for (int s = 0; s < seqs; ++s) {
    auto& t = tables[static_cast<std::size_t>(s)];
    t.resize(static_cast<std::size_t>(per_seq));
    std::iota(t.begin(), t.end(), s * per_seq);
    auto& p = prompts[static_cast<std::size_t>(s)];
    for (int i = 0; i < len; ++i) p.push_back(static_cast<int32_t>((s * 7919 + i * 104729) % 150000));
  }
  std::vector<float> logits;
  Speed sp;
  auto t0 = Clock::now();
  for (int s = 0; s < seqs; ++s) {
    runtime::SeqChunk ch;
    ch.tokens = prompts[static_cast<std::size_t>(s)];
    ch.block_table = tables[static_cast<std::size_t>(s)];
    ch.logits_last = true;
    model.forward({&ch, 1}, logits);
  }
  sp.prefill = seqs * len / std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<int32_t> next(static_cast<std::size_t>(seqs));  // a different token for each sequence
  for (int s = 0; s < seqs; ++s) next[static_cast<std::size_t>(s)] = static_cast<int32_t>((42 + s * 4099) % 150000);
  std::vector<runtime::SeqChunk> batch(static_cast<std::size_t>(seqs));
  int64_t touched = 0, layer_steps = 0;
  std::vector<int64_t> before = model.expert_tokens();
  t0 = Clock::now();
  for (int step = 0; step < steps; ++step) {
    for (int s = 0; s < seqs; ++s) {
      auto& ch = batch[static_cast<std::size_t>(s)];
      ch.start_pos = len + step;
      ch.tokens = {&next[static_cast<std::size_t>(s)], 1};
      ch.block_table = tables[static_cast<std::size_t>(s)];
      ch.logits_last = true;
    }
    model.forward(batch, logits);
    if (c.moe.any()) {  // counters read outside the timing would be fairer; they are a copy of a few hundred ints
      const std::vector<int64_t> after = model.expert_tokens();
      for (std::size_t i = 0; i < after.size(); ++i) touched += after[i] > before[i];
      layer_steps += static_cast<int64_t>(after.size()) / c.moe.experts;
      before = after;
    }
  }
  sp.decode = seqs * steps / std::chrono::duration<double>(Clock::now() - t0).count();
  if (layer_steps > 0) sp.experts_touched = static_cast<double>(touched) / static_cast<double>(layer_steps);
  return sp;
}

}  // namespace tandem::perf
