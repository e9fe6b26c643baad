// The conformance suite over NCCL, one GPU per rank:
//   nccl_conformance --devices     exit 0 when two GPUs are visible (else says why, exit 1)
//   mpirun -np 2 nccl_conformance  the suite (rank 0 sends, rank 1 receives)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/nccl/nccl_transport.h"
#include "transport_suite.h"

int main(int argc, char** argv) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (argc > 1 && std::strcmp(argv[1], "--devices") == 0) {
    if (devices >= 2) return 0;
    std::printf("SKIP: NCCL conformance needs two GPUs; %d visible\n", devices);
    return 1;
  }
  tandem::mpi::MpiEnv env(&argc, &argv);
  cudaSetDevice(env.rank() % (devices > 0 ? devices : 1));
  int failures = 0, checks = 0;
  {
    tandem::mpi::NcclTransport t(env.world());
    tandem::conformance::PoolAccess device;
    device.write = [](uint8_t* d, const void* s, std::size_t n) {  // landed before the transport's stream reads it
      if (cudaMemcpy(d, s, n, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        std::abort();
    };
    device.read = [](void* d, const uint8_t* s, std::size_t n) {
      if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
    };
    const auto f = tandem::conformance::run_transport_suite(
        t,
        [&] {
          MPI_Request r;
          MPI_Ibarrier(env.world(), &r);
          for (int done = 0; !done;) {
            MPI_Test(&r, &done, MPI_STATUS_IGNORE);
            (void)t.progress();
          }
        },
        device);
    for (const auto& s : f.list) std::printf("FAIL [rank %d] %s\n", env.rank(), s.c_str());
    int mine[2] = {static_cast<int>(f.list.size()), f.checks}, all[2] = {0, 0};
    MPI_Reduce(mine, all, 2, MPI_INT, MPI_SUM, 0, env.world());
    failures = all[0];
    checks = all[1];
  }
  if (env.rank() == 0) std::printf("nccl conformance: %d passed, %d failed\n", checks - failures, failures);
  return env.rank() == 0 && failures > 0 ? 1 : 0;
}
