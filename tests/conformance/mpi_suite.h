// The conformance suite on MPI ranks (the MPI backends and NCCL): a barrier
// that keeps driving the transport (the suite's pump), since a two-sided
// target places incoming blocks only when it makes progress; and every
// rank's failures printed and summed on rank 0.
#pragma once

#include <mpi.h>

#include <cstdio>
#include <utility>

#include "transport_suite.h"

namespace tandem::conformance {

// A barrier over `world` that keeps pumping the transport while it waits.
inline Barrier mpi_barrier(MPI_Comm world) {
  return [world](const std::function<void()>& pump) {
    MPI_Request r;
    MPI_Ibarrier(world, &r);
    for (int done = 0; !done;) {
      MPI_Test(&r, &done, MPI_STATUS_IGNORE);
      pump();
    }
  };
}

inline Failures run_transport_suite_mpi(MPI_Comm world, mpi::KvTransport& t, const PoolAccess& access = {},
                                        bool caller_memory = false) {
  return run_transport_suite(t, mpi_barrier(world), access, caller_memory);
}

inline Failures run_slice_suite_mpi(MPI_Comm world, mpi::KvTransport& t, const PoolAccess& access = {}) {
  return run_slice_suite(t, mpi_barrier(world), access);
}

// Prints this rank's failures; returns (failures, checks) summed over the ranks (on rank 0).
inline std::pair<int, int> gather_failures(MPI_Comm world, const Failures& f) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  for (const auto& s : f.list) std::printf("FAIL [rank %d] %s\n", rank, s.c_str());
  int mine[2] = {static_cast<int>(f.list.size()), f.checks}, all[2] = {0, 0};
  MPI_Reduce(mine, all, 2, MPI_INT, MPI_SUM, 0, world);
  return {all[0], all[1]};
}

}  // namespace tandem::conformance
