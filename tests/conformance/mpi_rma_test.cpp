// The conformance suite over MPI RMA, on real ranks: mpirun -np 3 mpi_rma_test
#include <cstdio>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "transport_suite.h"

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  int failures = 0, checks = 0;
  {
    tandem::mpi::MpiRmaTransport t(env.world());
    const auto f = tandem::conformance::run_transport_suite(t, [&] { MPI_Barrier(env.world()); });
    for (const auto& s : f.list) std::printf("FAIL [rank %d] %s\n", env.rank(), s.c_str());
    int mine[2] = {static_cast<int>(f.list.size()), f.checks}, all[2] = {0, 0};
    MPI_Reduce(mine, all, 2, MPI_INT, MPI_SUM, 0, env.world());
    failures = all[0];
    checks = all[1];
  }
  if (env.rank() == 0) std::printf("mpi_rma conformance: %d passed, %d failed\n", checks - failures, failures);
  return env.rank() == 0 && failures > 0 ? 1 : 0;
}
