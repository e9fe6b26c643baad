// Who does what in a job: world rank 0 routes; the other ranks are workers,
// each a tensor-parallel group, on the prefill side or the decode side
// (aggregated: every worker on the decode side, doing both).
#pragma once

#include <cstdint>
#include <vector>

#include "topology/group_map.h"
#include "topology/side.h"

namespace tandem::topology {

// What the job asks for (job.mode and [cluster], as the launcher read them).
enum class Mode { kDisagg, kAgg, kAuto };
struct Ask {
  Mode mode = Mode::kDisagg;
  BySide<int> tp{1, 1};             // cluster.prefill_tp, cluster.decode_tp (or tp)
  BySide<int64_t> ranks{0, 0};      // cluster.prefill_ranks, decode_ranks; 0: not given
  double prefill_fraction = 0.5;    // the prefill share when neither count is given
};

// The shape of one worker: how its ranks divide the model. Today a
// tensor-parallel width; expert parallelism places a mixture-of-experts
// model's experts across the same ranks, and pipeline stages would multiply
// them (ranks() is what a worker occupies, whatever its dimensions).
struct WorkerShape {
  int tp = 1;
  int ranks() const { return tp; }
  bool operator==(const WorkerShape&) const = default;
};

// A worker rank's group: its width, its place in it (0: the leader) and its side.
struct Group {
  int width = 1, place = 0;
  Side side = Side::kDecode;
};

// The split: how many ranks each side has, the shape of its workers, and
// which ranks make up each worker (`groups`: in rank order, ranks 1..P
// prefilling, until the job places them by node: place_by_node).
struct Roles {
  BySide<int> ranks;  // prefill 0: aggregated
  BySide<WorkerShape> shape;
  GroupMap groups;
  bool disaggregated() const { return ranks.prefill > 0; }
  int width(Side s) const { return shape[s].tp; }
  int workers() const { return ranks.prefill / shape.prefill.ranks() + ranks.decode / shape.decode.ranks(); }
  const GroupMap& map() const { return groups; }
  // Each worker's lowest rank, its leader: the rank the router and the other workers talk to.
  std::vector<int> leaders(Side s) const { return groups.leaders(s); }
  Group group_of(int rank) const;
};

// How the workers split. Throws tandem::Error on a split that cannot be,
// naming the keys to change (every rank computes the same answer).
Roles plan_roles(const Ask& ask, int world_size);
// job.mode = "auto" with workers to re-split: two or more, and with two
// widths room for a prefill and a decode worker (else the job runs
// aggregated, unplanned).
bool planned_job(const Ask& ask, const Roles& roles, int world_size);
// Two widths under the planner: the workers are cells of lcm(prefill_tp,
// decode_tp) ranks (cells.h); 0 when the workers do not regroup.
int cell_ranks(const Ask& ask, const Roles& roles, int world_size);
// The lowest worker's leader: it speaks for all where one must (the KV store's warnings and index).
int first_leader(const Roles& roles);

}  // namespace tandem::topology
