// Where a job's ranks stand: this rank's place (Layout, made by job.cpp's
// lay_out from topology/) with its communicators, and what it shares its node
// with (Node). Shared by the job's wiring (job.cpp) and a worker rank's
// parts and loop (worker_rank.h).
#pragma once

#include <string>
#include <vector>

#include "mpi_transport/comm.h"
#include "runtime/service/protocol.h"
#include "topology/place.h"

namespace tandem::launcher {

// Where this rank stands (topology::Place: its roles, group and cell, the
// same data on every rank) and the communicators that wiring needs: the
// workers' communicator never changes (KV windows live on it); each group's
// is split from it once, and a cell's rank splits its other form's group at
// the start too, so a regroup splits none. Roles are rank 0's word (kRoles),
// not communicators: nothing is sent to a role as a whole, so a re-split
// between epochs splits no communicator and no worker waits for another.
struct Layout : topology::Place {
  mpi::Comm workers, group_comm, other_comm;
  service::Role role() const { return service::role_for(disaggregated, side()); }
};

// This rank's node: how many workers share it, and (GPU workers) the device
// each binds, with the check that no two share one. The error, or "".
struct Node {
  int local_workers = 1;
  int cpu_sharers = 1;  // this node's workers whose CPUs (affinity) overlap this rank's, itself included
  std::string gpu_name;  // the workers' GPU (rank 0 learns it from rank 1)
  std::vector<std::string> hosts;  // every rank's host, by rank
};

}  // namespace tandem::launcher
