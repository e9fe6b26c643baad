// Which GPU each worker of a node computes on, and the check that no two
// share one: the n-th worker of a node takes its n-th visible device (all
// visible: mpirun, srun --gpus-per-node), which is also its only one when the
// launcher gave each task its own (srun --gpus-per-task=1).
#pragma once

#include <string>
#include <vector>

namespace tandem::launcher {

// Workers on a node of `local_size` ranks: all of them, less rank 0 on its node.
inline int workers_on_node(int local_size, bool router_here) { return local_size - (router_here ? 1 : 0); }

// The device index of the worker whose rank on its node is `local_rank`
// (ranks are ordered by world rank, so rank 0 is its node's first and takes none).
inline int worker_device_index(int local_rank, bool router_here) { return local_rank - (router_here ? 1 : 0); }

// For world rank `me`: the error when another worker of its node computes on
// the same device (uuids[i] of world rank ranks[i]; "" for rank 0), else "".
inline std::string shared_device_error(int me, const std::vector<int>& ranks, const std::vector<std::string>& uuids) {
  std::string mine;
  for (std::size_t i = 0; i < ranks.size(); ++i)
    if (ranks[i] == me) mine = uuids[i];
  if (mine.empty()) return "";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] == me || uuids[i] != mine) continue;
    return "worker ranks " + std::to_string(std::min(me, ranks[i])) + " and " + std::to_string(std::max(me, ranks[i])) +
           " would share one GPU (" + mine + ") on this node: start one worker rank per GPU plus rank 0 " +
           "(with G GPUs per node: srun --nodes=N --ntasks=G*N+1 --gpus-per-node=G), or give each task its own GPU " +
           "(srun --gpus-per-task=1)";
  }
  return "";
}

}  // namespace tandem::launcher
