// Where a job's ranks stand: the roles and tensor-parallel groups this rank
// is part of (Layout, made by job.cpp's lay_out) and what it shares its node
// with (Node). Shared by the job's wiring (job.cpp) and a worker rank's
// parts and loop (worker_rank.h).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "launcher/run/job_checks.h"
#include "mpi_transport/comm.h"
#include "runtime/service/protocol.h"

namespace tandem::launcher {

// Who does what: rank 0 routes; P ranks prefill, the rest decode (agg: all
// do both), each worker a tensor-parallel group whose ranks share a node
// where the allocation allows (service::place_by_node; else in rank order).
// The workers' communicator never changes (KV windows live on it); each
// group's is split from it once. Roles are rank 0's word (kRoles), not
// communicators: nothing is sent to a role as a whole, so a re-split between
// epochs, which moves whole groups from one role to the other, splits no
// communicator and no worker waits for another.
struct Layout {
  Roles roles;
  bool planned = false;  // job.mode = "auto": roles change between epochs, so KV must move from the start
  bool keep_roles = true;  // ranks 1..P prefill (cluster.placement = "rank", a heterogeneous job, one worker)
  bool prefill = false;  // this rank prefills
  Roles::Group group;    // this worker rank's group
  service::Role role = service::Role::kWorker;  // a worker's (rank 0 with -np 1 too)
  mpi::Comm workers, group_comm;
  // Two widths under job.mode = "auto" (router/regroups.h): the workers are
  // cells of `cell` consecutive ranks, each running prefill workers or decode
  // ones; this rank's group in its cell's other form, with that group's
  // communicator (split with the first, at the start: a regroup splits none).
  bool regroups = false;
  int cell = 0;
  Roles::Group other;
  mpi::Comm other_comm;
  int incarnation = 0;  // how many times this rank has regrouped
};

// A cell's lowest rank (its key), and its workers of `width` (consecutive ranks from the key).
inline int cell_key(int rank, int cell) { return 1 + ((rank - 1) / cell) * cell; }
inline std::vector<std::vector<int>> cell_groups(int key, int cell, int width) {
  std::vector<std::vector<int>> out;
  for (int leader = key; leader < key + cell; leader += width) {
    out.emplace_back();
    for (int r = leader; r < leader + width; ++r) out.back().push_back(r);
  }
  return out;
}

// The lowest worker's leader: it speaks for all where one must (the store's warnings and index).
inline int first_leader(const Roles& r) {
  const auto p = r.leaders(true), d = r.leaders(false);
  if (p.empty()) return d.empty() ? 1 : d.front();
  return d.empty() ? p.front() : std::min(p.front(), d.front());
}

// This rank's node: how many workers share it, and (GPU workers) the device
// each binds, with the check that no two share one. The error, or "".
struct Node {
  int local_workers = 1;
  int cpu_sharers = 1;  // this node's workers whose CPUs (affinity) overlap this rank's, itself included
  std::string gpu_name;  // the workers' GPU (rank 0 learns it from rank 1)
  std::vector<std::string> hosts;  // every rank's host, by rank
};

}  // namespace tandem::launcher
