// The conformance suite over NCCL, one GPU per rank:
//   nccl_conformance --devices     exit 0 when two GPUs are visible (else says why, exit 1)
//   mpirun -np 2 nccl_conformance  the suite (rank 0 sends, rank 1 receives)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>

#include "mpi_transport/mpi_env.h"
#include "mpi_transport/nccl/nccl_transport.h"
#include "mpi_suite.h"

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
  for (const bool caller_memory : {false, true}) {  // the pool cudaMalloc'ed by the transport, then the caller's
    tandem::mpi::NcclTransport t(env.world());
    tandem::conformance::PoolAccess device;
    device.write = [](uint8_t* d, const void* s, std::size_t n) {  // landed before the transport's stream reads it
      if (cudaMemcpy(d, s, n, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
        std::abort();
    };
    device.read = [](void* d, const uint8_t* s, std::size_t n) {
      if (cudaDeviceSynchronize() != cudaSuccess || cudaMemcpy(d, s, n, cudaMemcpyDeviceToHost) != cudaSuccess) std::abort();
    };
    device.allocate = [](std::size_t n) -> std::shared_ptr<void> {
      void* p = nullptr;
      if (cudaMalloc(&p, n) != cudaSuccess || cudaMemset(p, 0, n) != cudaSuccess) std::abort();
      return std::shared_ptr<void>(p, [](void* q) { cudaFree(q); });
    };
    const auto f = tandem::conformance::run_transport_suite_mpi(env.world(), t, device, caller_memory);
    const auto [failed, checked] = tandem::conformance::gather_failures(env.world(), f);
    failures += failed;
    checks += checked;
  }
  if (env.rank() == 0) std::printf("nccl conformance: %d passed, %d failed\n", checks - failures, failures);
  return env.rank() == 0 && failures > 0 ? 1 : 0;
}
