// The conformance suite over the MPI backends, on real ranks:
//   mpirun -np 3 conformance_mpi rma|two_sided
#include <cstdio>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/mpi_rma/mpi_rma_transport.h"
#include "mpi_transport/mpi_two_sided/mpi_two_sided_transport.h"

#include <cstring>
#include <memory>
#include "transport_suite.h"

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  int failures = 0, checks = 0;
  const bool two_sided = argc > 1 && std::strcmp(argv[1], "two_sided") == 0;
  {
    std::unique_ptr<tandem::mpi::KvTransport> owned;
    if (two_sided) owned = std::make_unique<tandem::mpi::MpiTwoSidedTransport>(env.world());
    else owned = std::make_unique<tandem::mpi::MpiRmaTransport>(env.world());
    tandem::mpi::KvTransport& t = *owned;
    // A barrier that keeps driving the transport: a two-sided target places
    // incoming blocks only when it makes progress.
    const auto f = tandem::conformance::run_transport_suite(t, [&] {
      MPI_Request r;
      MPI_Ibarrier(env.world(), &r);
      for (int done = 0; !done;) {
        MPI_Test(&r, &done, MPI_STATUS_IGNORE);
        (void)t.progress();
      }
    });
    for (const auto& s : f.list) std::printf("FAIL [rank %d] %s\n", env.rank(), s.c_str());
    int mine[2] = {static_cast<int>(f.list.size()), f.checks}, all[2] = {0, 0};
    MPI_Reduce(mine, all, 2, MPI_INT, MPI_SUM, 0, env.world());
    failures = all[0];
    checks = all[1];
  }
  if (env.rank() == 0)
    std::printf("%s conformance: %d passed, %d failed\n", two_sided ? "mpi_two_sided" : "mpi_rma", checks - failures,
                failures);
  return env.rank() == 0 && failures > 0 ? 1 : 0;
}
