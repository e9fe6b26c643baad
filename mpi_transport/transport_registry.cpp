#include "mpi_transport/transport_registry.h"

#ifdef TANDEM_NCCL
#include "mpi_transport/nccl/nccl_transport.h"
#endif
#ifdef TANDEM_LIBFABRIC
#include "mpi_transport/libfabric/libfabric_transport.h"
#endif

namespace tandem::mpi {

std::unique_ptr<KvTransport> make_optional_transport(std::string_view name, MPI_Comm comm, const std::string& provider) {
#ifdef TANDEM_NCCL
  if (name == "nccl") return std::make_unique<NcclTransport>(comm);
#endif
#ifdef TANDEM_LIBFABRIC
  if (name == "libfabric") return std::make_unique<LibfabricTransport>(comm, provider);
#endif
  (void)name;
  (void)comm;
  (void)provider;
  return nullptr;
}

bool optional_transport_built(std::string_view name) {
#ifdef TANDEM_NCCL
  if (name == "nccl") return true;
#endif
#ifdef TANDEM_LIBFABRIC
  if (name == "libfabric") return true;
#endif
  (void)name;
  return false;
}

}  // namespace tandem::mpi
