#include "runtime/cpu/expert_parallel.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "runtime/cpu/kernels.h"

namespace tandem::runtime::cpu {

void route_rows(float* logits, int64_t rows, int64_t experts, int64_t top_k, bool renormalise, int32_t* expert,
                float* weight) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = logits + r * experts;
    int32_t* ex = expert + r * top_k;
    float* wt = weight + r * top_k;
    const float max = *std::max_element(p, p + experts);
    float sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += (p[e] = exp_fixed(p[e] - max));
    for (int64_t e = 0; e < experts; ++e) p[e] /= sum;
    float chosen = 0;
    for (int64_t k = 0; k < top_k; ++k) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e)
        if (std::find(ex, ex + k, e) == ex + k && (best < 0 || p[e] > p[best])) best = e;
      ex[k] = static_cast<int32_t>(best);
      wt[k] = p[best];
      chosen += p[best];
    }
    if (renormalise)
      for (int64_t k = 0; k < top_k; ++k) wt[k] /= chosen;
  }
}

std::vector<int64_t> rows_by_rank(std::span<const int64_t> expert_tokens, int64_t experts, int width) {
  // A width that does not divide the experts cannot be expert-parallel (tp_problem refuses it): one rank holds all.
  if (width < 1 || experts <= 0 || experts % width != 0) width = 1;
  std::vector<int64_t> out(static_cast<std::size_t>(width));
  if (experts <= 0) return out;
  const ExpertSplit split{0, static_cast<int>(out.size()), experts};
  for (std::size_t i = 0; i < expert_tokens.size(); ++i)
    out[static_cast<std::size_t>(split.owner(static_cast<int64_t>(i) % experts))] += expert_tokens[i];
  return out;
}

CombinePlan plan_combine(std::span<const int32_t> route_expert, int64_t top_k, const ExpertSplit& split) {
  const auto w = static_cast<std::size_t>(split.width);
  const auto rows = static_cast<int64_t>(route_expert.size()) / top_k;
  CombinePlan p;
  p.send.resize(w);
  p.recv.resize(w);
  p.home_rows.resize(w);
  p.slots = rows * top_k;
  for (int q = 0; q < split.width; ++q)
    p.home_rows[static_cast<std::size_t>(q)] = home_begin(rows, split.width, q + 1) - home_begin(rows, split.width, q);
  const int64_t mine0 = home_begin(rows, split.width, split.rank), mine1 = home_begin(rows, split.width, split.rank + 1);
  for (int q = 0; q < split.width; ++q) {
    const int64_t r0 = home_begin(rows, split.width, q), r1 = home_begin(rows, split.width, q + 1);
    for (int64_t s = r0 * top_k; s < r1 * top_k; ++s) {
      if (split.owns(route_expert[static_cast<std::size_t>(s)]) && q != split.rank)
        p.send[static_cast<std::size_t>(q)].push_back(s);
    }
  }
  for (int64_t s = mine0 * top_k; s < mine1 * top_k; ++s) {
    const int o = split.owner(route_expert[static_cast<std::size_t>(s)]);
    if (o != split.rank) p.recv[static_cast<std::size_t>(o)].push_back(s);
    else p.kept.push_back(s);
  }
  return p;
}

void lay_out_combine(const CombinePlan& plan, float* slot_out, int64_t hidden, CombineBuffers& b) {
  const auto h = static_cast<std::size_t>(hidden);
  std::size_t sent = 0, received = 0;
  for (const auto& slots : plan.send) sent += slots.size();
  for (const auto& slots : plan.recv) received += slots.size();
  b.send.resize(sent * h);
  b.recv.resize(received * h);
  b.write.assign(static_cast<std::size_t>(plan.slots), nullptr);
  b.read.assign(static_cast<std::size_t>(plan.slots), nullptr);
  for (const int64_t s : plan.kept) b.read[static_cast<std::size_t>(s)] = b.write[static_cast<std::size_t>(s)] = slot_out + s * hidden;
  float* out = b.send.data();
  for (const auto& slots : plan.send)
    for (const int64_t s : slots) b.write[static_cast<std::size_t>(s)] = std::exchange(out, out + h);
  const float* in = b.recv.data();
  for (const auto& slots : plan.recv)
    for (const int64_t s : slots) b.read[static_cast<std::size_t>(s)] = std::exchange(in, in + h);
}

void exchange_slots(TpGroup& group, const CombinePlan& plan, int64_t hidden, CombineBuffers& b) {
  const std::size_t w = plan.send.size();
  std::vector<int64_t> send_counts(w), recv_counts(w);
  for (std::size_t q = 0; q < w; ++q) {
    send_counts[q] = static_cast<int64_t>(plan.send[q].size()) * hidden;
    recv_counts[q] = static_cast<int64_t>(plan.recv[q].size()) * hidden;
  }
  group.all_to_all(b.send.data(), send_counts, b.recv.data(), recv_counts);
}

}  // namespace tandem::runtime::cpu
