#include "topology/place.h"

#include <algorithm>
#include <string>
#include <utility>

#include "common/error.h"

namespace tandem::topology {

Place place_of(int rank, Roles roles, bool planned, bool keep_roles, int cell) {
  Place p;
  p.rank = rank;
  p.planned = planned;
  p.keep_roles = keep_roles;
  p.disaggregated = roles.disaggregated();
  p.cell = cell;
  p.group = roles.group_of(rank);
  if (cell > 0 && rank >= 1) {
    const Side o = other(p.group.side);
    const int width = roles.width(o), key = cell_key(rank, cell);
    p.other = {width, (rank - key) % width, o};
  }
  p.roles = std::move(roles);
  return p;
}

Place regroup(const Place& now, const std::vector<int>& prefill_keys) {
  if (!now.regroups() || now.rank < 1)
    throw Error("rank " + std::to_string(now.rank) + " was told to regroup but is in no cell (tandem internal error; "
                "please report it)");
  const int key = now.key();
  const Side target = now.other.side;
  const bool prefills = std::find(prefill_keys.begin(), prefill_keys.end(), key) != prefill_keys.end();
  if (prefills != (target == Side::kPrefill))
    throw Error("rank " + std::to_string(now.rank) + " was told to regroup into the form it has (tandem internal "
                "error; please report it)");
  BySide<Groups> groups;
  for (Side s : kSides)
    for (auto& g : now.roles.map().groups(s))
      if (cell_key(g.front(), now.cell) != key) groups[s].push_back(std::move(g));
  for (auto& g : cell_groups(key, now.cell, now.other.width)) groups[target].push_back(std::move(g));
  Place next = now;
  next.roles.groups = GroupMap(std::move(groups.prefill), std::move(groups.decode));
  std::swap(next.group, next.other);
  next.disaggregated = !prefill_keys.empty();
  ++next.incarnation;
  return next;
}

}  // namespace tandem::topology
