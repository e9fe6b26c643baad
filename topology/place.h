// Where one rank stands in the job, and where it stands after a regroup:
// data, computed the same on every rank from the roles (no messages, no MPI).
// The launcher executes it (launcher/run/job.cpp makes the communicators of
// a place, worker_rank.cpp builds its worker and, at a regroup, the next).
#pragma once

#include <vector>

#include "topology/cells.h"
#include "topology/roles.h"
#include "topology/side.h"

namespace tandem::topology {

struct Place {
  int rank = 0;
  Roles roles;  // the split, and the groups as this rank last heard of them (a regroup changes them)
  bool planned = false;     // job.mode = "auto": sides change between epochs, so KV must move from the start
  bool keep_roles = true;   // ranks 1..P prefill (cluster.placement = "rank", a heterogeneous job, one worker)
  bool disaggregated = false;  // some worker prefills now (else every worker does both)
  int cell = 0;             // ranks per cell where the workers regroup between widths (else 0)
  Group group;              // this rank's worker, in the form it runs now
  Group other;              // and in its cell's other form (cell > 0)
  int incarnation = 0;      // how many times this rank has regrouped
  bool regroups() const { return cell > 0; }
  Side side() const { return group.side; }
  int key() const { return cell_key(rank, cell); }  // its cell's (cell > 0)
  // The leader of this rank's worker in the cell's other form (cell > 0).
  int other_leader() const { return key() + (rank - key()) / other.width * other.width; }
};

// A rank's place under `roles` (placed as the job placed them), `cell` ranks
// per cell (cell_ranks(), 0: none).
Place place_of(int rank, Roles roles, bool planned, bool keep_roles, int cell);

// The place after its cell regroups into its other form, as rank 0's kRegroup
// says: `prefill_keys` are the cells that prefill from now on. The cell's
// groups in the map become those of the new form, every other worker as this
// rank last knew it. Throws tandem::Error when the word does not move this
// cell into its other form (an internal error: rank 0 regroups only cells
// whose form changes).
Place regroup(const Place& now, const std::vector<int>& prefill_keys);

}  // namespace tandem::topology
