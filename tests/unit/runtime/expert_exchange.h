// Expert parallelism's combine exchange (runtime/cpu/expert_parallel.h) in
// the transport conformance style, for any TpGroup: in-process threads
// (tp_test.cpp) or MPI ranks (tests/mpi/tp_group_test.cpp). Each case is a
// routing every rank knows; each rank writes the outputs of the slots its
// experts computed where the layout says (lay_out_combine), and after the
// exchange every slot of its home rows must read exactly what the owning
// rank wrote.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/cpu/expert_parallel.h"

namespace tandem::testing {

struct ExchangeCase {
  std::string name;
  int64_t experts = 8, top_k = 2, rows = 0;
  std::vector<int32_t> route;  // [rows][top_k]
};

// The cases at `width` ranks (experts 8): every row's experts on another
// rank than its home; rows choosing experts 0 and 1 only (the other ranks'
// experts empty); every row to one expert (top 1); fewer rows than ranks;
// no rows; a hundred rows routed at random.
inline std::vector<ExchangeCase> exchange_cases(int width) {
  std::vector<ExchangeCase> out;
  const int64_t per = 8 / width;
  ExchangeCase away{"every expert on another rank than the row's home", 8, 2, 13, {}};
  for (int64_t r = 0; r < away.rows; ++r) {
    int home = 0;
    while (runtime::cpu::home_begin(away.rows, width, home + 1) <= r) ++home;
    const int64_t other = ((home + 1) % width) * per;  // the next rank's experts (width 1: its own)
    away.route.push_back(static_cast<int32_t>(other));
    away.route.push_back(static_cast<int32_t>(other + per - 1 == other ? (other + 1) % 8 : other + per - 1));
  }
  out.push_back(away);
  ExchangeCase empty{"experts 0 and 1 only: the other experts empty", 8, 2, 11, {}};
  for (int64_t r = 0; r < empty.rows; ++r) empty.route.insert(empty.route.end(), {static_cast<int32_t>(r % 2), static_cast<int32_t>(1 - r % 2)});
  out.push_back(empty);
  ExchangeCase one{"every row to expert 7 (top 1)", 8, 1, 9, std::vector<int32_t>(9, 7)};
  out.push_back(one);
  ExchangeCase few{"fewer rows than ranks", 8, 2, 1, {5, 2}};
  out.push_back(few);
  out.push_back({"no rows", 8, 2, 0, {}});
  ExchangeCase many{"a hundred rows at random", 8, 2, 100, {}};
  uint64_t x = 88172645463325252ull;
  for (int64_t r = 0; r < many.rows; ++r) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    const auto a = static_cast<int32_t>(x % 8), b = static_cast<int32_t>((a + 1 + (x >> 8) % 7) % 8);
    many.route.insert(many.route.end(), {a, b});
  }
  out.push_back(many);
  return out;
}

// Runs one case as `group`'s rank; "" when this rank's home slots are right,
// else what went wrong.
inline std::string check_exchange(runtime::cpu::TpGroup& group, const ExchangeCase& c) {
  constexpr int64_t kHidden = 5;
  const auto [rank, width] = group.shard();
  const runtime::cpu::ExpertSplit split{rank, width, c.experts};
  auto value = [](int64_t slot, int64_t i) { return static_cast<float>(slot * 100 + i) + 0.25f; };
  std::vector<float> slot_out(static_cast<std::size_t>(c.rows * c.top_k * kHidden), -1.0f);
  const auto plan = runtime::cpu::plan_combine(c.route, c.top_k, split);
  runtime::cpu::CombineBuffers b;
  runtime::cpu::lay_out_combine(plan, slot_out.data(), kHidden, b);
  std::string why;  // every rank goes on to the exchanges, right or wrong, so that none waits for ever
  for (int64_t s = 0; s < c.rows * c.top_k; ++s) {
    float* to = b.write[static_cast<std::size_t>(s)];
    if ((to != nullptr) != split.owns(c.route[static_cast<std::size_t>(s)]) && why.empty())
      why = c.name + ": rank " + std::to_string(rank) + " has " + (to ? "a" : "no") + " place to write slot " +
            std::to_string(s);
    if (to)
      for (int64_t i = 0; i < kHidden; ++i) to[i] = value(s, i);
  }
  runtime::cpu::exchange_slots(group, plan, kHidden, b);
  const int64_t r0 = runtime::cpu::home_begin(c.rows, width, rank), r1 = runtime::cpu::home_begin(c.rows, width, rank + 1);
  for (int64_t s = 0; s < c.rows * c.top_k && why.empty(); ++s) {
    const float* from = b.read[static_cast<std::size_t>(s)];
    if ((from != nullptr) != (s >= r0 * c.top_k && s < r1 * c.top_k)) {
      why = c.name + ": rank " + std::to_string(rank) + " has " + (from ? "a" : "no") + " place to read slot " +
            std::to_string(s);
      break;
    }
    for (int64_t i = 0; from && i < kHidden && why.empty(); ++i)
      if (from[i] != value(s, i))
        why = c.name + ": rank " + std::to_string(rank) + " of " + std::to_string(width) + ", slot " + std::to_string(s) +
              " holds " + std::to_string(from[i]);
  }
  // The combined rows gathered back: every rank gets every home's rows.
  std::vector<int64_t> counts;
  for (const int64_t n : plan.home_rows) counts.push_back(n * kHidden);
  std::vector<float> mine(static_cast<std::size_t>((r1 - r0) * kHidden)), all(static_cast<std::size_t>(c.rows * kHidden));
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < kHidden; ++i) mine[static_cast<std::size_t>((r - r0) * kHidden + i)] = value(r, -i);
  group.all_gather(mine.data(), counts, all.data());
  for (int64_t r = 0; r < c.rows && why.empty(); ++r)
    for (int64_t i = 0; i < kHidden && why.empty(); ++i)
      if (all[static_cast<std::size_t>(r * kHidden + i)] != value(r, -i))
        why = c.name + ": rank " + std::to_string(rank) + " gathered row " + std::to_string(r) + " wrong";
  return why;
}

}  // namespace tandem::testing
