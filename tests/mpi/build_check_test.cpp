// Every rank must run the same protocol and build: check_same_build on real
// MPI ranks, agreeing, then with one rank's version or build different.
// Run under mpirun -np 3.
#include <mpi.h>

#include <cstdio>
#include <string>

#include "mpi_transport/mpi_env.h"

int main(int argc, char** argv) {
  tandem::mpi::MpiEnv env(&argc, &argv);
  int failures = 0;
  auto expect = [&](bool ok, const char* what, const std::string& got) {
    if (!ok) {
      std::printf("FAIL [rank %d] %s: got \"%s\"\n", env.rank(), what, got.c_str());
      ++failures;
    }
  };
  const std::string same = tandem::mpi::check_same_build(MPI_COMM_WORLD, 3, "tandem 1.0");
  expect(same.empty(), "same protocol and build: no error", same);
  const int last = env.size() - 1;
  const std::string version = tandem::mpi::check_same_build(MPI_COMM_WORLD, env.rank() == last ? 4 : 3, "tandem 1.0");
  expect(version.find("rank " + std::to_string(last) + " (on ") == 0 && version.find("protocol 4") != std::string::npos &&
             version.find("run the same tandem binary on every node") != std::string::npos,
         "another protocol on the last rank is named", version);
  const std::string build =
      tandem::mpi::check_same_build(MPI_COMM_WORLD, 3, env.rank() == 1 ? "tandem 0.9" : "tandem 1.0");
  expect(build.find("rank 1 (on ") == 0 && build.find("\"tandem 0.9\"") != std::string::npos,
         "another build on rank 1 is named", build);
  int total = 0;
  MPI_Reduce(&failures, &total, 1, MPI_INT, MPI_SUM, 0, MPI_COMM_WORLD);
  if (env.rank() == 0) std::printf("%s\n", total ? "FAILED" : "every rank agrees on who differs");
  return total ? 1 : 0;
}
