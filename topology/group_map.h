// Which world ranks make up each worker, and where they sit.
//
// A worker is a tensor-parallel group of ranks; its lowest rank leads it (the
// rank the router and the other workers talk to), the others follow in rank
// order (their place in the group). Prefill workers come first. In rank
// order, ranks 1..P prefill in groups of prefill_tp and the next D decode in
// groups of decode_tp; placed by node, each group is made of ranks that share
// a node where the allocation allows: a group's exchanges (two per layer)
// then never cross the network.
#pragma once

#include <string>
#include <vector>

#include "topology/side.h"

namespace tandem::topology {

class GroupMap {
 public:
  GroupMap() = default;
  // In rank order: ranks 1..prefill_ranks in groups of prefill_tp, the next
  // decode_ranks in groups of decode_tp.
  GroupMap(int prefill_ranks, int prefill_tp, int decode_ranks, int decode_tp);
  // Explicit groups, each of world ranks (any order; the lowest leads).
  GroupMap(std::vector<std::vector<int>> prefill, std::vector<std::vector<int>> decode);

  // A rank in no worker (rank 0) is a group of its own.
  int width_at(int rank) const;
  int leader_of(int rank) const;
  int place_of(int rank) const;
  // The side of rank's group (a rank in no worker: decode, as an aggregated worker).
  Side side_at(int rank) const;
  // The rank at `place` of the group that `leader` leads.
  int member(int leader, int place) const;
  std::vector<int> members(int rank) const;  // of rank's group
  // The leaders of one side's workers, lowest first.
  std::vector<int> leaders(Side side) const;
  // Every leader, ordered so that each prefix takes from every node in
  // proportion to its workers (a node's in rank order): the planner's
  // re-splits prefill on the first k, and stay spread over the nodes.
  std::vector<int> leaders_by_node(const std::vector<std::string>& hosts) const;
  // The groups whose ranks are on more than one of `hosts` (by world rank).
  std::vector<std::vector<int>> spanning(const std::vector<std::string>& hosts) const;
  // Every worker's ranks on one side, ascending, lowest leader first.
  std::vector<std::vector<int>> groups(Side side) const;
  bool operator==(const GroupMap&) const = default;
  // "1-4" for consecutive ranks, else "1, 3, 5, 7".
  static std::string describe(const std::vector<int>& ranks);

 private:
  const std::vector<int>* group_at(int rank) const;  // nullptr: in no worker
  std::vector<std::vector<int>> groups_;  // prefill's first, each ascending
  int prefill_groups_ = 0;
  std::vector<int> group_of_;  // by world rank; -1: none (rank 0)
};

// The workers placed by node (on one node: rank order). Each group is made
// of ranks that share a node where the ranks allow, taking nodes in the
// order of their lowest worker rank and each node's ranks in rank order.
// Disaggregated with one width, the prefill groups are spread over the nodes
// in proportion to each node's groups (so a prompt's KV can stay on its
// node), each node's lowest-ranked groups prefilling. keep_roles instead
// holds each role to its rank range (ranks 1..P prefill, as a heterogeneous
// Slurm job's components or cluster.placement = "rank" ask) and only
// regroups within it; so do different widths, prefill's groups placed first.
// There, when rank order already keeps every group on one node, or placing
// by node would not keep more of them on one, the map is rank order's.
GroupMap place_by_node(const std::vector<std::string>& hosts, int prefill_ranks, int prefill_tp, int decode_ranks,
                       int decode_tp, bool keep_roles);

}  // namespace tandem::topology
