// Cells: the units the planner re-splits. With two widths under job.mode =
// "auto" a cell is lcm(prefill_tp, decode_tp) consecutive ranks that run
// either prefill workers of prefill_tp ranks or decode workers of decode_tp
// ranks: its two forms. With one width a cell is one worker, the same in
// both forms (it changes side without regrouping).
//
//   cell of ranks 5-8, prefill_tp 4, decode_tp 2:
//     prefill form   [ 5  6  7  8 ]          one worker of 4 ranks
//     decode form    [ 5  6 ] [ 7  8 ]       two workers of 2 ranks
//
// A cell records the form it runs now and the one it is to run: they differ
// while it regroups (router/regroups.h drives that, one cell at a time).
#pragma once

#include <cstdint>
#include <vector>

#include "topology/roles.h"
#include "topology/side.h"

namespace tandem::topology {

using Groups = std::vector<std::vector<int>>;  // workers, each its world ranks ascending

struct Cell {
  BySide<Groups> forms;  // its workers in each form
  Side form = Side::kDecode;    // the form it runs now
  Side target = Side::kDecode;  // the form it is to run (differs from `form` while it regroups)
  const Groups& groups(Side s) const { return forms[s]; }
  int key() const { return forms.decode.front().front(); }  // its lowest rank
  bool one_form() const { return forms.prefill == forms.decode; }
  bool regrouping() const { return form != target; }
};

// A cell's lowest rank (its key), for a rank of a job with cells of `cell` ranks.
inline int cell_key(int rank, int cell) { return 1 + ((rank - 1) / cell) * cell; }
// A cell's workers of `width`: consecutive ranks from its key.
Groups cell_groups(int key, int cell, int width);
// The job's cells in rank order: of `cell` ranks (cell_ranks()), ranks 1..P
// starting in the prefill form; or, with cell 0, one per worker of `roles`.
std::vector<Cell> job_cells(const Roles& roles, int cell);

// A cell's KV pool, in bytes, where it regroups between widths a and b (its
// memory is registered once, its blocks laid out again at each regroup):
// within both forms' room, no more than the form that wants more wants, and
// at least a block of each.
uint64_t cell_pool_bytes(double want_a, double room_a, double want_b, double room_b, uint64_t block_a, uint64_t block_b);

}  // namespace tandem::topology
