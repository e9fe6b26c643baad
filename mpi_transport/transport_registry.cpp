#include "mpi_transport/transport_registry.h"

#ifdef TANDEM_NCCL
#include "mpi_transport/nccl/nccl_tp_group.h"
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

std::unique_ptr<runtime::DeviceGroup> make_device_group(MPI_Comm group) {
#ifdef TANDEM_NCCL
  return std::make_unique<NcclTpGroup>(group);
#else
  (void)group;
  return nullptr;
#endif
}

}  // namespace tandem::mpi
