#include "topology/roles.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "common/error.h"

namespace tandem::topology {

Group Roles::group_of(int rank) const {
  if (rank < 1) return {};  // rank 0 routes (or, alone, is a one-rank worker)
  return {groups.width_at(rank), groups.place_of(rank), groups.side_at(rank)};
}

namespace {

std::string ranks_word(int n) { return std::to_string(n) + (n == 1 ? " rank" : " ranks"); }

// ranks must be whole workers of `tp` ranks each.
void check_whole(const char* key, int ranks, const char* tp_key, int tp) {
  if (ranks % tp != 0)
    throw Error(std::string(key) + " = " + std::to_string(ranks) + " is not a multiple of " + tp_key + " = " +
                std::to_string(tp) + " (a worker is " + ranks_word(tp) + "); make it one");
}

Roles in_rank_order(int prefill, int decode, int prefill_tp, int decode_tp) {
  return {{prefill, decode}, {{prefill_tp}, {decode_tp}}, GroupMap(prefill, prefill_tp, decode, decode_tp)};
}

}  // namespace

Roles plan_roles(const Ask& ask, int world_size) {
  const int workers = std::max(1, world_size - 1);
  const int a = ask.tp.prefill, b = ask.tp.decode;
  if (b > 1 && world_size - 1 < b)
    throw Error("cluster.decode_tp (or tp) = " + std::to_string(b) + ": a worker of " + ranks_word(b) + " needs at least " +
                std::to_string(b + 1) + " ranks (rank 0 routes); this job has " + std::to_string(world_size) +
                "; start more, or lower the width");
  // Aggregated: every worker does both, at the decode width. So is a job with room for one worker only.
  if (ask.mode == Mode::kAgg || world_size <= 2 || workers < a + b) {
    if (workers % b != 0)
      throw Error("the " + std::to_string(workers) + " worker ranks of this job (ranks - 1) are not whole workers of " +
                  ranks_word(b) + " (cluster.decode_tp, or tp); start a multiple of " + std::to_string(b) +
                  " worker ranks");
    return in_rank_order(0, workers, a, b);
  }
  int p = static_cast<int>(ask.ranks.prefill);
  int d = static_cast<int>(ask.ranks.decode);
  // Two widths under the planner: the workers are cells of lcm(a, b) ranks, each running prefill workers or decode ones.
  const int cell = ask.mode == Mode::kAuto && a != b ? std::lcm(a, b) : 0;
  if (cell > 0 && workers % cell != 0)
    throw Error("cluster.prefill_tp = " + std::to_string(a) + " and cluster.decode_tp = " + std::to_string(b) +
                " under job.mode = \"auto\" make the workers cells of " + ranks_word(cell) + " (each runs prefill "
                "workers or decode workers, as the planner splits them); the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1) are not whole cells: start a multiple of " +
                std::to_string(cell) + " worker ranks");
  if (p == 0 && d == 0) {  // the split nearest prefill_fraction in whole workers of each width (or whole cells)
    const double want = ask.prefill_fraction * workers;
    for (int k = cell > 0 ? cell : a; k <= workers - b; k += cell > 0 ? cell : a)
      if ((workers - k) % b == 0 && (p == 0 || std::abs(k - want) < std::abs(p - want))) p = k;
    if (p == 0)
      throw Error("the " + std::to_string(workers) + " worker ranks of this job (ranks - 1) cannot be split into prefill "
                  "workers of " + ranks_word(a) + " and decode workers of " + ranks_word(b) +
                  "; start a number of ranks that can, or set job.mode = \"agg\"");
  } else if (p == 0) {
    p = workers - d;
  } else if (d == 0) {
    d = workers - p;
  }
  if (d == 0) d = workers - p;
  const bool one_set = (ask.ranks.prefill > 0) != (ask.ranks.decode > 0);
  if (one_set && (p < 1 || d < 1)) {
    const bool pre = ask.ranks.prefill > 0;
    throw Error(std::string(pre ? "cluster.prefill_ranks" : "cluster.decode_ranks") + " = " +
                std::to_string(pre ? ask.ranks.prefill : ask.ranks.decode) + " leaves no " +
                (pre ? "decode" : "prefill") + " rank among the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1); lower it, or start more ranks");
  }
  if (p < 1 || d < 1 || p + d != workers) {
    throw Error("cluster.prefill_ranks = " + std::to_string(ask.ranks.prefill) + " and cluster.decode_ranks = " +
                std::to_string(ask.ranks.decode) + " do not split the " + std::to_string(workers) +
                " worker ranks of this job (ranks - 1); make them add up, or set only one of them");
  }
  if (cell > 0 && p % cell != 0)
    throw Error("cluster.prefill_ranks = " + std::to_string(p) + " is not whole cells of " + ranks_word(cell) +
                " (lcm of cluster.prefill_tp and cluster.decode_tp: under job.mode = \"auto\" each cell runs prefill "
                "or decode workers); make it a multiple of " + std::to_string(cell));
  check_whole("cluster.prefill_ranks", p, "cluster.prefill_tp (or tp)", a);
  check_whole("cluster.decode_ranks", d, "cluster.decode_tp (or tp)", b);
  return in_rank_order(p, d, a, b);
}

bool planned_job(const Ask& ask, const Roles& roles, int world_size) {
  return ask.mode == Mode::kAuto && world_size > 2 && roles.workers() >= 2 &&
         (roles.shape.prefill == roles.shape.decode || roles.disaggregated());
}

int cell_ranks(const Ask& ask, const Roles& roles, int world_size) {
  if (!planned_job(ask, roles, world_size) || roles.shape.prefill == roles.shape.decode) return 0;
  return std::lcm(roles.shape.prefill.ranks(), roles.shape.decode.ranks());
}

int first_leader(const Roles& r) {
  const auto p = r.leaders(Side::kPrefill), d = r.leaders(Side::kDecode);
  if (p.empty()) return d.empty() ? 1 : d.front();
  return d.empty() ? p.front() : std::min(p.front(), d.front());
}

}  // namespace tandem::topology
