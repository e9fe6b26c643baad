// Registry of optional hardware support: the one launcher file that asks the
// build which backends are compiled in.
#include "launcher/build_info.h"

#include <mpi.h>

#include "launcher/version.h"
#ifdef TANDEM_WITH_CUDA
#include "runtime/cuda/devices.h"
#endif

namespace tandem::launcher {

std::string build_info() {
  std::string out = "tandem " + std::string(kVersion) + "\n";
  out += "  compiler: g++ " __VERSION__ "\n";
  out += "  MPI standard " + std::to_string(MPI_VERSION) + "." + std::to_string(MPI_SUBVERSION);
#ifdef OMPI_MAJOR_VERSION
  out += ", Open MPI " + std::to_string(OMPI_MAJOR_VERSION) + "." + std::to_string(OMPI_MINOR_VERSION) + "." +
         std::to_string(OMPI_RELEASE_VERSION);
#endif
  out += "\n  built with:";
#ifdef TANDEM_WITH_CUDA
  out += " CUDA=on";
#else
  out += " CUDA=off";
#endif
#ifdef TANDEM_WITH_NCCL
  out += " NCCL=on";
#else
  out += " NCCL=off";
#endif
#ifdef TANDEM_WITH_LIBFABRIC
  out += " libfabric=on";
#else
  out += " libfabric=off";
#endif
#ifdef TANDEM_SANITIZER
  out += " sanitizer=" TANDEM_SANITIZER;
#endif
  out += "\n";
#ifdef TANDEM_WITH_CUDA
  out += "  " + runtime::cuda::devices_summary() + "\n";
#endif
  return out;
}

}  // namespace tandem::launcher
