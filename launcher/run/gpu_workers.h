// GPU workers at start-up: each binds its device (the n-th worker of a node
// its n-th visible GPU, device_binding.h), the node checks that no two share
// one, and every rank learns the first worker's GPU (for the planner).
#pragma once

#include <mpi.h>

#include <string>

namespace tandem::launcher {

// Binds this worker's device and compares device UUIDs across the node
// (collective over `local`, which rank 0 joins with no device). This rank's
// error, or "" (then combine the ranks' with the job's verdict).
std::string bind_worker_device(const std::string& backend, int rank, int world_size, MPI_Comm local, int local_rank,
                               bool router_here);

// The first worker's (rank 1's) GPU name, on every rank (collective over world).
std::string first_worker_gpu(const std::string& backend, int rank, MPI_Comm world);

}  // namespace tandem::launcher
